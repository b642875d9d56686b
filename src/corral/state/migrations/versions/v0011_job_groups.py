"""Job groups: a managed pipeline's tasks may run side by side (`execution: parallel`), and a group's
auxiliary task is stopped a delay after its primary tasks have ended. False and NULL for every job
from before (a pipeline's tasks ran one after another; no task was auxiliary).

Revision ID: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("managed_jobs") as batch:
        batch.add_column(sa.Column("pipeline_parallel", sa.Boolean, nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("termination_delay", sa.Float, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("managed_jobs") as batch:
        batch.drop_column("termination_delay")
        batch.drop_column("pipeline_parallel")

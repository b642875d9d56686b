"""Where an attempt's stderr goes when an sbatch script sends it to a file of its own (`--error`), apart
from its log: read by `corral logs --stderr`. NULL for every attempt before, and for those whose stderr
is in the log.

Revision ID: 0015
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("error_path", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("error_path")

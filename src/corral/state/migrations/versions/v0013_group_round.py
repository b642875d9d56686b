"""A job group's round: the tasks placed together on one cluster share one (a task recovered beside
them joins theirs; a group that moves whole starts a new one), and their CORRAL_JOBGROUP_HOSTS
folder is named by it, so that no task reads a host file that an earlier round left. NULL for every
job from before (their folder has no round).

Revision ID: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("managed_jobs") as batch:
        batch.add_column(sa.Column("group_round", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("managed_jobs") as batch:
        batch.drop_column("group_round")

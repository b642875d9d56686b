"""Whether a job group's host folders (`~/.corral/groups/<group id>` on each cluster its tasks ran
on) have been removed by the server's pass over ended jobs (run_files.py): False for every job
group's task until then, True after, NULL for other managed jobs. Groups from before start at False,
so that their folders go too. Indexed: the pass reads the groups still to clean.

Revision ID: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("managed_jobs") as batch:
        batch.add_column(sa.Column("group_files_removed", sa.Boolean(), nullable=True))
    op.create_index("ix_managed_jobs_group_files_removed", "managed_jobs", ["group_files_removed"])
    managed = sa.table("managed_jobs", sa.column("pipeline_parallel", sa.Boolean()),
                       sa.column("group_files_removed", sa.Boolean()))
    op.execute(managed.update().where(managed.c.pipeline_parallel.is_(True)).values(group_files_removed=False))


def downgrade() -> None:
    op.drop_index("ix_managed_jobs_group_files_removed", "managed_jobs")
    with op.batch_alter_table("managed_jobs") as batch:
        batch.drop_column("group_files_removed")

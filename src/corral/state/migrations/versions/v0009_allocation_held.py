"""What Slurm gave a dev allocation, per node, as its holder read it (SLURM_CPUS_ON_NODE, the job's
memory): what a later task's `cpus` and `memory` are held against when the allocation was held
without a number of them. NULL until the holder has started (and for allocations from before).

Revision ID: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("allocations") as batch:
        batch.add_column(sa.Column("held_cpus", sa.Integer, nullable=True))
        batch.add_column(sa.Column("held_memory_mb", sa.Integer, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("allocations") as batch:
        batch.drop_column("held_memory_mb")
        batch.drop_column("held_cpus")

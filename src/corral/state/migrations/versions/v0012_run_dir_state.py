"""What is left of an attempt's run directory on its cluster (models.RunDirState): NULL while Corral
has removed nothing of it, as for every attempt from before. The server's pass over ended attempts
(run_files.py) finds those it has not yet cleaned through the index.

Revision ID: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("run_dir_state", sa.String(16), nullable=True))
    op.create_index("ix_attempts_run_dir_state", "attempts", ["run_dir_state"])


def downgrade() -> None:
    op.drop_index("ix_attempts_run_dir_state", "attempts")
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("run_dir_state")

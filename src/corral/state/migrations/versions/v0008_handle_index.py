"""Attempts are found by the infra's handle (a Slurm job id): `corral cancel 4711` and `corral logs
4711` take the id `squeue` and `corral queue` show, through an index rather than a scan of history.

Revision ID: 0008
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_attempts_handle", "attempts", ["handle"])


def downgrade() -> None:
    op.drop_index("ix_attempts_handle", "attempts")

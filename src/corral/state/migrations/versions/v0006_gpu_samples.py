"""GPU use over time for the dashboard's chart: samples of free, total and pending GPUs per cluster,
partition and type, taken by the lease holder and kept for a retention period (usage.py).

Revision ID: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gpu_samples",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("cluster", sa.String(256), nullable=False),
        sa.Column("partition", sa.String(256), nullable=False),
        sa.Column("gpu", sa.String(256), nullable=False),
        sa.Column("free", sa.Integer, nullable=False),
        sa.Column("total", sa.Integer, nullable=False),
        sa.Column("pending", sa.Integer, nullable=False),
    )
    op.create_index("ix_gpu_samples_at", "gpu_samples", ["at"])


def downgrade() -> None:
    op.drop_index("ix_gpu_samples_at", "gpu_samples")
    op.drop_table("gpu_samples")

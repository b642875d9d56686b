"""The store keeps the infra's opaque handles, not Slurm's columns: `attempts.slurm_job_id` and
`allocations.slurm_job_id` become `handle`, `allocations.gres` becomes `accelerator`, and
`attempts.array_index` goes (a copy's index is part of its handle, read by the infra).

Revision ID: 0002
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.alter_column("slurm_job_id", new_column_name="handle")
        batch.drop_column("array_index")
    with op.batch_alter_table("allocations") as batch:
        batch.alter_column("slurm_job_id", new_column_name="handle")
        batch.alter_column("gres", new_column_name="accelerator")


def downgrade() -> None:
    import sqlalchemy as sa

    with op.batch_alter_table("allocations") as batch:
        batch.alter_column("accelerator", new_column_name="gres")
        batch.alter_column("handle", new_column_name="slurm_job_id")
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("array_index", sa.Integer, nullable=True))
        batch.alter_column("handle", new_column_name="slurm_job_id")

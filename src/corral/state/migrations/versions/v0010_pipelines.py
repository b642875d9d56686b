"""Managed pipelines: a managed job may be one task of a pipeline (its first task's job id, the
pipeline's name and the task's place in it). NULL for every job from before.

Revision ID: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("managed_jobs") as batch:
        batch.add_column(sa.Column("pipeline_id", sa.String(32), nullable=True))
        batch.add_column(sa.Column("pipeline_name", sa.String(256), nullable=True))
        batch.add_column(sa.Column("pipeline_stage", sa.Integer, nullable=True))
        batch.create_index("ix_managed_jobs_pipeline_id", ["pipeline_id"])


def downgrade() -> None:
    with op.batch_alter_table("managed_jobs") as batch:
        batch.drop_index("ix_managed_jobs_pipeline_id")
        batch.drop_column("pipeline_stage")
        batch.drop_column("pipeline_name")
        batch.drop_column("pipeline_id")

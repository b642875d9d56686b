"""Each user's SSH key for reaching their own accounts on the clusters (accounts.py): the public half in
clear, the private half sealed. Users added before have none; one is made when first needed.

Revision ID: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("users") as batch:
        batch.add_column(sa.Column("ssh_public_key", sa.Text, nullable=True))
        batch.add_column(sa.Column("ssh_key_sealed", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("users") as batch:
        batch.drop_column("ssh_key_sealed")
        batch.drop_column("ssh_public_key")

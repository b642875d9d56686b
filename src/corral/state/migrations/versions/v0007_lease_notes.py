"""A lease carries a note from its holder: a replica's heartbeat says which cluster list it reads, so
that replicas reading different clusters files stop driving jobs instead of driving some twice
(controller/shards.py).

Revision ID: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("leases") as batch:
        batch.add_column(sa.Column("note", sa.String(256), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("leases") as batch:
        batch.drop_column("note")

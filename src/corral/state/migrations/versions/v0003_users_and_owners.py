"""A team server's users (`users`: a role, the hash of each API token, Unix accounts per cluster), and
an owner for every job and dev allocation. Allocation names become per user: the primary key of
`allocations` is (owner, name). Rows made before have the owner "" (the server's own user).

Revision ID: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

ALLOCATION_COLUMNS = ("name", "token", "cluster", "partition", "handle", "num_nodes", "accelerator",
                      "gpus_per_node", "resources", "run_dir", "idle_seconds", "created_at")


def _allocation_columns() -> list[sa.Column]:
    """The columns of `allocations` besides its key, before and after this revision."""
    return [
        sa.Column("token", sa.String(64), nullable=False),
        sa.Column("cluster", sa.String(256), nullable=False),
        sa.Column("partition", sa.String(256), nullable=False),
        sa.Column("handle", sa.String(64), nullable=True),
        sa.Column("num_nodes", sa.Integer, nullable=False),
        sa.Column("accelerator", sa.String(256), nullable=True),
        sa.Column("gpus_per_node", sa.Integer, nullable=False),
        sa.Column("resources", sa.Text, nullable=False),
        sa.Column("run_dir", sa.Text, nullable=False),
        sa.Column("idle_seconds", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    ]


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("unix_users", sa.Text, nullable=False),
        sa.Column("service", sa.Boolean, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=True),
    )
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("owner", sa.String(128), nullable=False, server_default=sa.text("''")))
        batch.create_index("ix_jobs_owner", ["owner"])
    # A new primary key: the same on SQLite and PostgreSQL by building the table anew.
    op.create_table(
        "allocations_new",
        sa.Column("owner", sa.String(128), primary_key=True, server_default=sa.text("''")),
        sa.Column("name", sa.String(128), primary_key=True),
        *_allocation_columns(),
    )
    columns = ", ".join(f'"{c}"' for c in ALLOCATION_COLUMNS)
    op.execute(f"INSERT INTO allocations_new (owner, {columns}) SELECT '', {columns} FROM allocations")
    op.drop_table("allocations")
    op.rename_table("allocations_new", "allocations")


def downgrade() -> None:
    op.drop_table("users")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_owner")
        batch.drop_column("owner")
    op.create_table(
        "allocations_old",
        sa.Column("name", sa.String(128), primary_key=True),
        *_allocation_columns(),
    )
    columns = ", ".join(f'"{c}"' for c in ALLOCATION_COLUMNS)
    # Names were unique across users before: where two users share one, the newest keeps it.
    op.execute(f"INSERT INTO allocations_old ({columns}) SELECT {columns} FROM allocations a WHERE NOT EXISTS "
               "(SELECT 1 FROM allocations b WHERE b.name = a.name AND b.created_at > a.created_at)")
    op.drop_table("allocations")
    op.rename_table("allocations_old", "allocations")

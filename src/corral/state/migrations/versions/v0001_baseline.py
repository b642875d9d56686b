"""Baseline: the schema every store had before Alembic (Corral up to issue 10's server work).

Revision ID: 0001
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import (
    Boolean,
    Column,
    Connection,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    inspect,
    text,
)

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

metadata = MetaData()

Table(
    "jobs", metadata,
    Column("id", String(32), primary_key=True),
    Column("name", String(256), nullable=False),
    Column("task_json", Text, nullable=False),
    Column("created_at", Float, nullable=False, index=True),
    Column("job_rank", Integer, nullable=False),
    Column("num_jobs", Integer, nullable=False),
    Column("sweep_id", String(32), nullable=True, index=True),
    Column("submitter", String(160), nullable=True),
    Column("allocation", String(128), nullable=True, index=True),
    Column("secrets_sealed", Text, nullable=True),
)
Table(
    "attempts", metadata,
    Column("token", String(64), primary_key=True),
    Column("job_id", String(32), ForeignKey("jobs.id"), nullable=False, index=True),
    Column("number", Integer, nullable=False),
    Column("cluster", String(256), nullable=False),
    Column("partition", String(256), nullable=False),
    Column("slurm_job_id", String(64), nullable=True),
    Column("array_index", Integer, nullable=True),
    Column("state", String(32), nullable=False, index=True),
    Column("created_at", Float, nullable=False),
    Column("reason", Text, nullable=True),
    Column("run_dir", Text, nullable=False),
    Column("log_path", Text, nullable=False),
    Column("submitted_at", Float, nullable=True),
    Column("started_at", Float, nullable=True),
    Column("ended_at", Float, nullable=True),
    Column("exit_code", Integer, nullable=True),
    Column("expected_start", Float, nullable=True),
    Column("failure", String(16), nullable=True),
    Column("submitter", String(160), nullable=True),
    Column("held", Boolean, nullable=True),
)
Table(
    "allocations", metadata,
    Column("name", String(128), primary_key=True),
    Column("token", String(64), nullable=False),
    Column("cluster", String(256), nullable=False),
    Column("partition", String(256), nullable=False),
    Column("slurm_job_id", String(64), nullable=True),
    Column("num_nodes", Integer, nullable=False),
    Column("gres", String(256), nullable=True),
    Column("gpus_per_node", Integer, nullable=False),
    Column("resources", Text, nullable=False),
    Column("run_dir", Text, nullable=False),
    Column("idle_seconds", Integer, nullable=False),
    Column("created_at", Float, nullable=False),
)
Table(
    "managed_jobs", metadata,
    Column("job_id", String(32), ForeignKey("jobs.id"), primary_key=True),
    Column("state", String(32), nullable=False, index=True),
    Column("reason", Text, nullable=True),
    Column("restarts_on_errors", Integer, nullable=False),
    Column("recoveries", Integer, nullable=False),
    Column("moves", Integer, nullable=False),
    Column("last_move_at", Float, nullable=False),
    Column("cancel_requested", Boolean, nullable=False),
    Column("updated_at", Float, nullable=False),
)
Table(
    "job_events", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(32), nullable=False, index=True),
    Column("at", Float, nullable=False),
    Column("state", String(32), nullable=False),
    Column("reason", Text, nullable=True),
)
Table(
    "leases", metadata,
    Column("name", String(64), primary_key=True),
    Column("holder", String(128), nullable=False),
    Column("expires_at", Float, nullable=False),
)
Table(
    "cluster_health", metadata,
    Column("cluster", String(256), primary_key=True),
    Column("failures", Integer, nullable=False),
    Column("unhealthy_until", Float, nullable=False),
    Column("unreachable_since", Float, nullable=True),
)


def upgrade() -> None:
    metadata.create_all(op.get_bind())


def downgrade() -> None:
    metadata.drop_all(op.get_bind())


def complete_legacy(connection: Connection) -> None:
    """A store made before Alembic, by any earlier Corral: add the tables, columns and indexes it lacks
    (they were only ever added, nullable), so that it is exactly the baseline."""
    metadata.create_all(connection, checkfirst=True)
    inspector = inspect(connection)
    for table in metadata.sorted_tables:
        present = {c["name"] for c in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name not in present:
                kind = column.type.compile(dialect=connection.dialect)
                connection.exec_driver_sql(f'ALTER TABLE {table.name} ADD COLUMN "{column.name}" {kind}')
                if (table.name, column.name) == ("attempts", "failure"):
                    _classify_old_failures(connection)
        indexed = {i["name"] for i in inspector.get_indexes(table.name)}
        for index in table.indexes:
            if index.name not in indexed:
                index.create(connection, checkfirst=True)


def _classify_old_failures(connection: Connection) -> None:
    """Stores written before attempts had a failure class kept Slurm's word in the reason; classify
    those rows once, so that the controller's rules read the class, never the words."""
    connection.execute(text("UPDATE attempts SET failure = 'infra' WHERE state = 'FAILED' AND (reason LIKE "
                            "'NODE_FAIL%' OR reason LIKE 'BOOT_FAIL%' OR reason LIKE 'PREEMPTED%')"))
    connection.execute(text("UPDATE attempts SET failure = 'task' WHERE state = 'FAILED' AND failure IS NULL"))
    connection.execute(text("UPDATE attempts SET failure = 'rejected' WHERE state = 'SUBMIT_FAILED' "
                            "AND reason LIKE '%: sbatch rejected the job: %'"))
    connection.execute(text("UPDATE attempts SET failure = 'lost' WHERE state IN ('SUBMIT_FAILED', 'LOST') "
                            "AND failure IS NULL"))

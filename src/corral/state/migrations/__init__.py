"""The store's schema history as Alembic revisions (`versions/`), applied by `upgrade()` whenever a
store is opened: a new store is created by them, an older one is brought up to date, data kept.

Stores made before Corral used Alembic (created from the models directly, then widened column by
column) are first completed to the baseline revision's columns and stamped with it, then upgraded.
Cost: one inspection of the schema per opening; migrations run once per store.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Connection, inspect

from corral.state.migrations.versions import v0001_baseline

HERE = Path(__file__).parent


def _config(connection: Connection):  # type: ignore[no-untyped-def]
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(HERE))
    config.attributes["connection"] = connection
    return config


def upgrade(connection: Connection) -> None:
    """Bring the store's schema to the newest revision (the caller holds the schema lock)."""
    from alembic import command

    tables = set(inspect(connection).get_table_names())
    config = _config(connection)
    if "alembic_version" not in tables and "jobs" in tables:  # made before Alembic
        v0001_baseline.complete_legacy(connection)
        command.stamp(config, v0001_baseline.revision)
    command.upgrade(config, "head")


def current(connection: Connection) -> str | None:
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(connection).get_current_revision()

"""The store's schema history as Alembic revisions (`versions/`), applied by `upgrade()` whenever a
store is opened: a new store is created by them, an older one is brought up to date, data kept.

Stores made before Corral used Alembic (created from the models directly, then widened column by
column) are first completed to the baseline revision's columns and stamped with it, then upgraded.
Cost: one inspection of the schema per opening; migrations run once per store.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Connection, inspect

HERE = Path(__file__).parent
HEAD = "0006"  # the newest revision in versions/ (tests/state/test_migrations.py checks it)


def _config(connection: Connection):  # type: ignore[no-untyped-def]
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(HERE))
    config.attributes["connection"] = connection
    return config


def upgrade(connection: Connection) -> None:
    """Bring the store's schema to the newest revision (the caller holds the schema lock). A store
    already there costs one query, and Alembic (~0.1 s to import) is not loaded."""
    tables = set(inspect(connection).get_table_names())
    if "alembic_version" in tables and current(connection) == HEAD:
        return
    from alembic import command

    config = _config(connection)
    if "alembic_version" not in tables and "jobs" in tables:  # made before Alembic
        from corral.state.migrations.versions import v0001_baseline

        v0001_baseline.complete_legacy(connection)
        command.stamp(config, v0001_baseline.revision)
    command.upgrade(config, "head")


def current(connection: Connection) -> str | None:
    """The store's revision (None for a store made before Alembic, or a new one)."""
    from sqlalchemy import text

    if "alembic_version" not in inspect(connection).get_table_names():
        return None
    return connection.execute(text("SELECT version_num FROM alembic_version")).scalar()


def head() -> str:
    """The newest revision, as Alembic reads it from versions/."""
    from alembic.script import ScriptDirectory

    return str(ScriptDirectory.from_config(_config(None)).get_current_head())

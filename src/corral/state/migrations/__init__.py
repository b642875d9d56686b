"""The store's schema history as Alembic revisions (`versions/`), applied by `upgrade()` whenever a
store is opened: an older store is brought up to date, data kept.

A new store is made from the models at once and stamped with the newest revision, as Alembic's own
guide advises ("create_all, then stamp head"): running every revision on an empty store imports
Alembic (~0.2 s) and replays six schema changes, and a person's first `corral` call pays for it.
tests/state/test_migrations.py checks that both ways give the same schema, the models'.

Stores made before Corral used Alembic (created from the models directly, then widened column by
column) are first completed to the baseline revision's columns and stamped with it, then upgraded.
Cost: one inspection of the schema per opening; migrations run once per store.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Connection, inspect

HERE = Path(__file__).parent
HEAD = "0015"  # the newest revision in versions/ (tests/state/test_migrations.py checks it)


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
    if not tables:
        create_at_head(connection)
        return
    from alembic import command

    config = _config(connection)
    if "alembic_version" not in tables and "jobs" in tables:  # made before Alembic
        from corral.state.migrations.versions import v0001_baseline

        v0001_baseline.complete_legacy(connection)
        command.stamp(config, v0001_baseline.revision)
    command.upgrade(config, "head")


def create_at_head(connection: Connection) -> None:
    """A new store: the models' tables, and Alembic's version table saying HEAD (as `alembic stamp` writes it)."""
    from sqlalchemy import Column, MetaData, PrimaryKeyConstraint, String, Table

    from corral.state.models import Base

    Base.metadata.create_all(connection)
    version = Table("alembic_version", MetaData(), Column("version_num", String(32), nullable=False),
                    PrimaryKeyConstraint("version_num", name="alembic_version_pkc"))
    version.create(connection)
    connection.execute(version.insert().values(version_num=HEAD))


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

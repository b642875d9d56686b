"""Durable state: one SQLAlchemy store, SQLite by default, PostgreSQL by URL."""

from corral.state.store import Store, open_store

__all__ = ["Store", "open_store"]

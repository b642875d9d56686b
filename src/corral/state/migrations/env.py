"""Alembic's entry point: runs the revisions on the connection `migrations.upgrade` passes in."""

from __future__ import annotations

from alembic import context

connection = context.config.attributes["connection"]
context.configure(connection=connection, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()

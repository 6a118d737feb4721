"""Alembic's environment for the run store: always run by ``ssr_server.store.migrate`` on a connection it
opens (online); offline SQL generation is not used."""

from __future__ import annotations

from alembic import context

from ssr_server.store.models import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run the run store's migrations through ssr_server.store.migrate")
context.configure(connection=connection, target_metadata=Base.metadata,
                  render_as_batch=connection.dialect.name == "sqlite")
with context.begin_transaction():
    context.run_migrations()

"""Schema migrations with Alembic, run by the server itself when it opens the store (no separate step to
forget): the scripts ship in the package (``migrations/``) and each database records its revision in
``alembic_version``. On PostgreSQL an advisory lock keeps replicas starting together from migrating twice.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import AsyncEngine

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
_LOCK_KEY = 0x55_52_53_54  # pg_advisory_lock key: "SRST"


def alembic_config(connection: Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = connection
    return cfg


def head() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


def _upgrade(connection: Connection) -> None:
    if current(connection) == head():
        return  # the common case: nothing to do, and no Alembic environment to load
    locked = connection.dialect.name == "postgresql"
    if locked:
        connection.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _LOCK_KEY})
    try:
        command.upgrade(alembic_config(connection), "head")
    finally:
        if locked:
            connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _LOCK_KEY})


async def upgrade(engine: AsyncEngine) -> None:
    """Bring the database to the latest schema."""
    async with engine.begin() as conn:
        await conn.run_sync(_upgrade)

"""From the ``SSR_RUN_STORE`` setting to an open, migrated store: ``off``; ``sqlite`` (a file under the cache
dir) or ``sqlite:///PATH``; ``postgresql://USER@HOST:PORT/DB`` (asyncpg)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ssr_server.core.config import Settings
from ssr_server.core.errors import InvalidRequest, public_message
from ssr_server.store.migrate import upgrade
from ssr_server.store.sql import SqlRunStore

SQLITE_FILE = "runs.sqlite3"
log = logging.getLogger(__name__)


def cache_root(settings: Settings) -> Path:
    """The cache dir: SSR_CACHE_DIR, else $XDG_CACHE_HOME/ssr-server, else ~/.cache/ssr-server."""
    if settings.cache_dir:
        return Path(settings.cache_dir)
    return Path(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache"))) / "ssr-server"


def store_url(settings: Settings) -> str | None:
    """The SQLAlchemy URL the setting names; None for ``off``."""
    spec = settings.run_store.strip()
    if spec in ("off", "none", "", "false", "0"):
        return None
    if spec == "sqlite":
        return f"sqlite+aiosqlite:///{cache_root(settings) / SQLITE_FILE}"
    scheme, sep, rest = spec.partition("://")
    if sep and scheme in ("sqlite", "sqlite+aiosqlite"):
        return f"sqlite+aiosqlite://{rest}"
    if sep and scheme in ("postgresql", "postgres", "postgresql+asyncpg"):
        return f"postgresql+asyncpg://{rest}"
    raise InvalidRequest(f"SSR_RUN_STORE must be off, sqlite, sqlite:///PATH or postgresql://..., "
                         f"got {spec.split('://')[0]!r}...")


def make_engines(url: str) -> tuple[AsyncEngine, Engine | None]:
    """The store's async engine, and for SQLite the sync engine of its writer thread (see store.sql)."""
    def dumps(value: Any) -> str:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))

    if not url.startswith("sqlite"):
        return create_async_engine(url, json_serializer=dumps, pool_size=10, max_overflow=10,
                                   pool_pre_ping=True), None
    path = url.split(":///", 1)[1]
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    engines = (create_async_engine(url, json_serializer=dumps, connect_args={"timeout": 30}),
               create_engine(url.replace("sqlite+aiosqlite", "sqlite+pysqlite", 1), json_serializer=dumps,
                             connect_args={"timeout": 30}))
    for sync in (engines[0].sync_engine, engines[1]):
        event.listen(sync, "connect", _pragmas)
    return engines


def _pragmas(dbapi_conn: Any, _: Any) -> None:
    cur = dbapi_conn.cursor()
    # WAL: readers never wait for the writer; NORMAL: a commit survives a process crash (not a power
    # cut), the usual choice with WAL.
    for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "foreign_keys=ON", "busy_timeout=30000"):
        cur.execute(f"PRAGMA {pragma}")
    cur.close()


async def open_store(settings: Settings) -> SqlRunStore | None:
    """The store the settings name, migrated to the latest schema and joined by this server (runs left
    in flight by dead servers marked ``interrupted``); None when the store is off."""
    url = store_url(settings)
    if url is None:
        return None
    engine, sync_engine = make_engines(url)
    try:
        await upgrade(engine)
        store = SqlRunStore(engine, sync_engine=sync_engine, max_runs=settings.run_store_max_runs,
                            ttl_s=settings.run_store_ttl_s, stale_s=3 * settings.run_store_heartbeat_s)
        await store.register()
        await store.sweep()
    except BaseException:
        await engine.dispose()
        if sync_engine is not None:
            sync_engine.dispose()
        raise
    return store


async def keep_alive(store: SqlRunStore, every_s: float) -> None:
    """This server's heartbeat, the runs of dead servers written off, retention: every ``every_s``
    until cancelled. A failing database is logged and tried again next time."""
    while True:
        await asyncio.sleep(every_s)
        try:
            interrupted = await store.heartbeat()
            swept = await store.sweep()
        except Exception as exc:
            log.warning("run store: heartbeat failed: %s", public_message(str(exc)))
            continue
        if interrupted or swept:
            log.info("run store: %d runs of stopped servers interrupted, %d old runs deleted", interrupted,
                     swept)

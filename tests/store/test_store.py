"""The store itself, on SQLite and on a real PostgreSQL: the schema the migrations build is the one the
code uses, retention by count and age spares runs in flight, runs of a dead server are written off (and
only those), cursors page without gaps or repeats."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from ssr_server.core.config import Settings
from ssr_server.store.backends import open_store
from ssr_server.store.records import NewRun, RunFilter
from ssr_server.store.sql import SqlRunStore


def run_with_store(url: str, work: Callable[[SqlRunStore], Awaitable[Any]], **settings: Any) -> Any:
    async def main() -> Any:
        store = await open_store(Settings(run_store=url, **settings))
        assert store is not None
        try:
            return await work(store)
        finally:
            await store.close()

    return asyncio.run(main())


async def add_runs(store: SqlRunStore, n: int, status: str = "completed", prefix: str = "r") -> list[str]:
    ids = []
    for i in range(n):
        rid = f"{prefix}{i:04}"
        await store.create(NewRun(rid, f"q{i}", "ssr", "default", {}), "running")
        await store.add_turn(rid, {"index": 0, "q": [0.5, 0.5]})
        if status != "running":
            await store.finish(rid, status, outcome="answered", answer="a", error=None, timings=None,
                               usage=None)
        ids.append(rid)
    return ids


def test_the_migrations_build_the_schema_the_code_uses(store_url: str) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from ssr_server.store.migrate import head
    from ssr_server.store.models import Base

    async def work(store: SqlRunStore) -> tuple[list[Any], str | None]:
        async with store.engine.connect() as conn:
            diff = await conn.run_sync(
                lambda c: compare_metadata(MigrationContext.configure(c), Base.metadata))
            rev = await conn.run_sync(lambda c: MigrationContext.configure(c).get_current_revision())
        return diff, rev

    diff, rev = run_with_store(store_url, work)
    assert rev == head() and diff == []


def test_retention_by_count_and_age_spares_runs_in_flight(store_url: str) -> None:
    async def work(store: SqlRunStore) -> None:
        old = await add_runs(store, 3, prefix="old")
        live = await add_runs(store, 1, status="running", prefix="live")
        new = await add_runs(store, 4, prefix="new")
        store.max_runs = 5
        assert await store.sweep() == 3  # the 3 oldest finished runs; the one in flight stays
        left = {r.id for r in (await store.list(RunFilter(), 100)).runs}
        assert left == set(live + new)
        assert await store.get(old[0]) is None and await store.turns(old[0]) == []
        store.max_runs, store.ttl_s = 0, 0.5
        await asyncio.sleep(0.6)
        assert await store.sweep() == 4
        assert {r.id for r in (await store.list(RunFilter(), 100)).runs} == set(live)

    run_with_store(store_url, work)


def test_runs_of_a_dead_server_become_interrupted_and_a_live_ones_do_not(store_url: str) -> None:
    async def work(store: SqlRunStore) -> None:
        # a second live server on the store
        other = SqlRunStore(store.engine, sync_engine=store.sync_engine, stale_s=store.stale_s)
        await other.register()
        await other.create(NewRun("theirs", "q", "ssr", "default", {}), "running")
        await store.create(NewRun("mine", "q", "ssr", "default", {}), "running")
        assert await store.recover() == 0  # both owners alive
        dead = other.instance
        from sqlalchemy import update

        from ssr_server.store.models import ServerRow

        async with store.engine.begin() as conn:  # the other server's heartbeat stopped long ago
            await conn.execute(update(ServerRow).where(ServerRow.id == dead)
                               .values(seen_at=time.time() - 999))
        assert await store.recover() == 1
        theirs, mine = await store.summary("theirs"), await store.summary("mine")
        assert theirs is not None and mine is not None
        assert (theirs.status, mine.status) == ("interrupted", "running")
        got = await store.get("theirs")
        assert got is not None and got.summary.finished_at is not None

    run_with_store(store_url, work)


def test_cursor_pages_cover_every_run_once_even_with_equal_times(store_url: str) -> None:
    async def work(store: SqlRunStore) -> None:
        ids = await add_runs(store, 7)
        from sqlalchemy import update

        from ssr_server.store.models import RunRow

        async with store.engine.begin() as conn:  # the same creation time: the id breaks the tie
            await conn.execute(update(RunRow).values(created_at=1000.0))
        seen: list[str] = []
        after = None
        while True:
            page = await store.list(RunFilter(), 3, after)
            seen += [r.id for r in page.runs]
            if not page.has_more:
                break
            after = page.runs[-1].id
        assert seen == sorted(ids, reverse=True)
        assert (await store.list(RunFilter(since=1000.5), 10)).runs == []

    run_with_store(store_url, work)


def test_a_write_whose_caller_is_cancelled_still_lands(store_url: str) -> None:
    """A run cancelled while its turn is being written (a client gone, a drain) loses nothing the store
    took: the write finishes; and writes that race (PostgreSQL's pool) never make the turn count go back."""
    async def work(store: SqlRunStore) -> None:
        await store.create(NewRun("c", "q", "ssr", "default", {}), "running")
        writes = [asyncio.create_task(store.add_turn("c", {"index": i, "q": [1.0]})) for i in range(5)]
        await asyncio.sleep(0)  # every write is under way
        writes[2].cancel()
        await asyncio.gather(*writes, return_exceptions=True)
        for _ in range(600):  # up to 30 s: the cancelled caller's write goes on without it
            if len(await store.turns("c")) == 5:
                break
            await asyncio.sleep(0.05)
        assert [t["index"] for t in await store.turns("c")] == [0, 1, 2, 3, 4]
        summary = await store.summary("c")
        assert summary is not None and summary.turns == 5

    run_with_store(store_url, work)


def test_closing_the_store_finishes_the_writes_already_queued(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.sqlite3'}"

    async def write_then_close() -> None:
        store = await open_store(Settings(run_store=url))
        assert store is not None
        await store.create(NewRun("w", "q", "ssr", "default", {}), "running")
        pending = [asyncio.create_task(store.add_turn("w", {"index": i})) for i in range(20)]
        await asyncio.sleep(0)
        await store.close()
        await asyncio.gather(*pending, return_exceptions=True)

    asyncio.run(write_then_close())

    async def count(store: SqlRunStore) -> int:
        return len(await store.turns("w"))

    assert run_with_store(url, count) == 20


def test_a_bad_store_setting_is_a_clear_error() -> None:
    from ssr_server.core.errors import InvalidRequest
    from ssr_server.store.backends import store_url

    with pytest.raises(InvalidRequest, match="SSR_RUN_STORE"):
        store_url(Settings(run_store="mysql://x"))
    assert store_url(Settings(run_store="off")) is None
    assert store_url(Settings(run_store="sqlite", cache_dir="/tmp/c")) == "sqlite+aiosqlite:////tmp/c/runs.sqlite3"
    assert store_url(Settings(run_store="postgresql://u@h:1/d")) == "postgresql+asyncpg://u@h:1/d"

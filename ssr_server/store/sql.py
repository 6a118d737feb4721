"""The run store on SQLAlchemy 2: one implementation for SQLite and PostgreSQL. Writes are small and per
event (a run's start, each turn, its end), so a crash loses at most the turn in flight. Runs in flight
belong to the server instance running them (``owner``); an instance that stops beating (or, on the same
host, whose process is gone) has its runs marked ``interrupted`` by the next instance that looks (at
start-up and at every heartbeat).

Every write is one function of a sync ``Connection``, run in one transaction by ``_write``. On PostgreSQL
it runs on the async engine (asyncpg, through ``run_sync``). On SQLite it runs whole in ONE hop to a
writer thread of its own, on a sync engine over the same file: through aiosqlite each statement, begin
and commit is its own hop between the event loop and the driver's thread (~0.45 ms of CPU each, measured),
which made a turn's write cost three times as much CPU, taken from the engine on a busy server. One
writer thread is also SQLite's own rule (one writer at a time), so writes queue there, not in busy
retries. Reads stay on the async engine (aiosqlite, asyncpg): WAL lets them run beside the writer.
"""

from __future__ import annotations

import asyncio
import math
import os
import socket
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, cast

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Table,
    and_,
    bindparam,
    case,
    delete,
    func,
    insert,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from ssr_server.core.errors import InvalidRequest
from ssr_server.store.models import ImageRow, RunRow, ServerRow, TurnRow
from ssr_server.store.records import (
    ACTIVE,
    INTERRUPTED,
    ImageBlob,
    ImageInfo,
    NewRun,
    Page,
    RunFilter,
    RunSummary,
    Status,
    StoredRun,
)

HOSTNAME = socket.gethostname()
T = TypeVar("T")
# A run's writes as Core statements built once, on the tables: each execution then skips building the
# statement and its cache key, and the ORM's bulk path (0.21 instead of 0.50 ms of CPU a turn, measured).
_RUNS, _TURNS, _IMAGES = (cast(Table, m.__table__) for m in (RunRow, TurnRow, ImageRow))
_INSERT_RUN, _INSERT_TURN, _INSERT_IMAGE = insert(_RUNS), insert(_TURNS), insert(_IMAGES)
_UPDATE_RUN = update(_RUNS).where(_RUNS.c.id == bindparam("rid"))  # SET: the other keys given
# the largest turn index seen + 1: writes that race on PostgreSQL's pool never make it go back
_SET_TURNS = _UPDATE_RUN.values(n_turns=case((_RUNS.c.n_turns < bindparam("n"), bindparam("n")),
                                             else_=_RUNS.c.n_turns))
_ADD_IMAGES = _UPDATE_RUN.values(n_images=_RUNS.c.n_images + bindparam("k"))
_SUMMARY = (RunRow.id, RunRow.status, RunRow.mode, RunRow.library, RunRow.question, RunRow.outcome,
            RunRow.answer, RunRow.error, RunRow.background, RunRow.created_at, RunRow.started_at,
            RunRow.finished_at, RunRow.total_s, RunRow.model_s, RunRow.tool_s, RunRow.n_turns,
            RunRow.n_images)


class SqlRunStore:
    def __init__(self, engine: AsyncEngine, *, sync_engine: Engine | None = None, max_runs: int = 0,
                 ttl_s: float = 0.0, stale_s: float = 30.0) -> None:
        """``engine`` for reads (and PostgreSQL's writes); ``sync_engine``: SQLite's writer (required
        for SQLite: see the module's docstring)."""
        self.engine = engine
        self.backend = engine.dialect.name
        if self.backend == "sqlite" and sync_engine is None:
            raise ValueError("a SQLite store needs its sync writer engine (backends.make_engines)")
        self.sync_engine = sync_engine
        self.max_runs, self.ttl_s, self.stale_s = max_runs, ttl_s, stale_s
        self.instance = uuid.uuid4().hex
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)
        self._writer = (ThreadPoolExecutor(1, thread_name_prefix="ssr-store-writer")
                        if sync_engine is not None else None)

    async def _write(self, work: Callable[[Connection], T]) -> T:
        """``work`` in one transaction. A caller cancelled meanwhile does not undo it: the write goes on
        to its commit (shielded). On SQLite writes commit in the order they are made (one writer)."""
        if self._writer is None:
            return await asyncio.shield(asyncio.ensure_future(self._write_async(work)))
        sync = self.sync_engine
        assert sync is not None

        def transaction() -> T:
            with sync.begin() as conn:
                return work(conn)

        return await asyncio.shield(asyncio.get_running_loop().run_in_executor(self._writer, transaction))

    async def _write_async(self, work: Callable[[Connection], T]) -> T:
        async with self.engine.begin() as conn:
            return await conn.run_sync(work)

    # ---- writing a run ----------------------------------------------------------------------------
    async def create(self, run: NewRun, status: Status) -> None:
        now = time.time()
        row = {"id": run.id, "status": status, "mode": run.mode, "library": run.library,
               "question": run.question, "background": run.background, "owner": self.instance,
               "created_at": now, "started_at": now if status == "running" else None, "n_turns": 0,
               "n_images": 0, "options": finite(run.options)}
        await self._write(lambda c: c.execute(_INSERT_RUN, row))

    async def add_images(self, run_id: str, images: list[tuple[int, ImageBlob]]) -> None:
        if not images:
            return
        rows = [{"run_id": run_id, "n": n, "media_type": b.media_type, "width": b.width,
                 "height": b.height, "source": b.source, "parent": b.parent,
                 "box": list(b.box) if b.box else None, "data": b.data} for n, b in images]

        def work(c: Connection) -> None:
            c.execute(_INSERT_IMAGE, rows)
            c.execute(_ADD_IMAGES, {"rid": run_id, "k": len(rows)})

        await self._write(work)

    async def add_turn(self, run_id: str, turn: dict[str, Any]) -> None:
        row = {"run_id": run_id, "idx": int(turn["index"]), "data": finite(turn)}

        def work(c: Connection) -> None:
            c.execute(_INSERT_TURN, row)
            c.execute(_SET_TURNS, {"rid": run_id, "n": row["idx"] + 1})

        await self._write(work)

    async def set_status(self, run_id: str, status: Status) -> None:
        values: dict[str, Any] = {"rid": run_id, "status": status}
        if status == "running":
            values["started_at"] = time.time()
        await self._write(lambda c: c.execute(_UPDATE_RUN, values))

    async def finish(self, run_id: str, status: Status, *, outcome: str | None, answer: str | None,
                     error: str | None, timings: dict[str, float] | None,
                     usage: dict[str, int] | None) -> None:
        t = timings or {}
        values = {"rid": run_id, "status": status, "outcome": outcome, "answer": answer, "error": error,
                  "finished_at": time.time(), "total_s": t.get("total_s"), "model_s": t.get("model_s"),
                  "tool_s": t.get("tool_s"), "usage": usage}
        await self._write(lambda c: c.execute(_UPDATE_RUN, values))

    # ---- reading ----------------------------------------------------------------------------------
    async def summary(self, run_id: str) -> RunSummary | None:
        async with self._sessions() as s:
            row = (await s.execute(select(*_SUMMARY).where(RunRow.id == run_id))).one_or_none()
        return None if row is None else _summary(row)

    async def get(self, run_id: str) -> StoredRun | None:
        async with self._sessions() as s:
            run = await s.get(RunRow, run_id)
            if run is None:
                return None
            turns = (await s.execute(select(TurnRow.data).where(TurnRow.run_id == run_id)
                                     .order_by(TurnRow.idx))).scalars().all()
            images = (await s.execute(
                select(ImageRow.n, ImageRow.media_type, ImageRow.width, ImageRow.height, ImageRow.source,
                       ImageRow.parent, ImageRow.box).where(ImageRow.run_id == run_id)
                .order_by(ImageRow.n))).all()
        summary = _summary(tuple(getattr(run, c.key) for c in _SUMMARY))
        return StoredRun(summary=summary, options=dict(run.options or {}), usage=dict(run.usage or {}),
                         turns=list(turns),
                         images=[ImageInfo(i.n, i.media_type, i.width, i.height, i.source, i.parent,
                                           _box(i.box)) for i in images])

    async def turns(self, run_id: str, start: int = 0) -> list[dict[str, Any]]:
        async with self._sessions() as s:
            rows = await s.execute(select(TurnRow.data).where(TurnRow.run_id == run_id, TurnRow.idx >= start)
                                   .order_by(TurnRow.idx))
            return list(rows.scalars().all())

    async def list(self, where: RunFilter, limit: int, after: str | None = None) -> Page:
        conds: list[ColumnElement[bool]] = []
        if where.status:
            conds.append(RunRow.status == where.status)
        if where.mode:
            conds.append(RunRow.mode == where.mode)
        if where.outcome:
            conds.append(RunRow.outcome == where.outcome)
        if where.since is not None:
            conds.append(RunRow.created_at >= where.since)
        if where.until is not None:
            conds.append(RunRow.created_at < where.until)
        async with self._sessions() as s:
            if after is not None:
                cursor = (await s.execute(select(RunRow.created_at).where(RunRow.id == after))).scalar()
                if cursor is None:
                    raise InvalidRequest(f"unknown cursor: no run {after!r} (deleted, or never stored)")
                conds.append(or_(RunRow.created_at < cursor,
                                 and_(RunRow.created_at == cursor, RunRow.id < after)))
            rows = (await s.execute(select(*_SUMMARY).where(*conds)
                                    .order_by(RunRow.created_at.desc(), RunRow.id.desc())
                                    .limit(limit + 1))).all()
        return Page([_summary(r) for r in rows[:limit]], has_more=len(rows) > limit)

    async def image(self, run_id: str, n: int) -> ImageBlob | None:
        async with self._sessions() as s:
            row = await s.get(ImageRow, (run_id, n))
            if row is None:
                return None
            return ImageBlob(row.data, row.media_type, row.width, row.height, row.source, row.parent,
                             _box(row.box))

    async def delete(self, run_id: str) -> bool:
        return await self._write(lambda c: _delete_runs(c, [run_id])) > 0

    # ---- the store's life -------------------------------------------------------------------------
    async def register(self) -> int:
        """This instance joins (its heartbeat row); the runs of instances found dead become
        ``interrupted``; how many did."""
        now = time.time()
        stmt = insert(ServerRow).values(id=self.instance, hostname=HOSTNAME, pid=os.getpid(), started_at=now,
                                        seen_at=now)
        await self._write(lambda c: c.execute(stmt))
        return await self.recover()

    async def heartbeat(self) -> int:
        """This instance is alive (re-joining if it was taken for dead); then ``recover``."""
        now = time.time()

        def work(c: Connection) -> None:
            done = c.execute(update(ServerRow).where(ServerRow.id == self.instance).values(seen_at=now))
            if not getattr(done, "rowcount", 1):
                c.execute(insert(ServerRow).values(id=self.instance, hostname=HOSTNAME, pid=os.getpid(),
                                                   started_at=now, seen_at=now))

        await self._write(work)
        return await self.recover()

    async def recover(self) -> int:
        """Runs in flight whose instance is gone (no heartbeat for ``stale_s``, or, on this host, its
        process has exited) become ``interrupted``, their finished turns kept; how many."""
        now = time.time()

        def work(c: Connection) -> int:
            servers = c.execute(select(ServerRow.id, ServerRow.hostname, ServerRow.pid,
                                       ServerRow.seen_at)).all()
            dead = [r.id for r in servers if r.id != self.instance and (
                r.seen_at < now - self.stale_s or (r.hostname == HOSTNAME and not _pid_alive(r.pid)))]
            alive = [r.id for r in servers if r.id not in dead]
            owner_gone = or_(RunRow.owner.is_(None), RunRow.owner.not_in(alive)) if alive else true()
            done = c.execute(update(RunRow).where(RunRow.status.in_(ACTIVE), owner_gone).values(
                status="interrupted", error=INTERRUPTED, finished_at=now))
            if dead:
                c.execute(delete(ServerRow).where(ServerRow.id.in_(dead)))
            return int(getattr(done, "rowcount", 0) or 0)

        return await self._write(work)

    async def sweep(self) -> int:
        """Retention: finished runs older than ``ttl_s``, and beyond the newest ``max_runs``, are
        deleted (runs in flight never); how many."""
        finished = RunRow.status.not_in(ACTIVE)
        ttl_s, max_runs, cutoff = self.ttl_s, self.max_runs, time.time() - self.ttl_s

        def work(c: Connection) -> int:
            gone = 0
            if ttl_s > 0:
                old = c.execute(select(RunRow.id).where(finished, RunRow.created_at < cutoff)).scalars().all()
                gone += _delete_runs(c, list(old))
            if max_runs > 0:
                count = c.execute(select(func.count()).select_from(RunRow)).scalar() or 0
                if count > max_runs:
                    extra = c.execute(select(RunRow.id).where(finished)
                                      .order_by(RunRow.created_at.asc(), RunRow.id.asc())
                                      .limit(count - max_runs)).scalars().all()
                    gone += _delete_runs(c, list(extra))
            return gone

        return await self._write(work)

    async def close(self) -> None:
        """Leave (this instance's row goes: its runs are all finished or written off by now)."""
        try:
            stmt = delete(ServerRow).where(ServerRow.id == self.instance)
            await self._write(lambda c: c.execute(stmt))
        finally:
            if self._writer is not None and self.sync_engine is not None:
                # after any write already queued (finished, not dropped), on the thread that made them
                await asyncio.wrap_future(self._writer.submit(self.sync_engine.dispose))
                self._writer.shutdown(wait=False)
            await self.engine.dispose()


def _delete_runs(c: Connection, ids: list[str]) -> int:
    total = 0
    for i in range(0, len(ids), 500):  # bounded IN lists
        chunk = ids[i:i + 500]
        c.execute(delete(TurnRow).where(TurnRow.run_id.in_(chunk)))
        c.execute(delete(ImageRow).where(ImageRow.run_id.in_(chunk)))
        done = c.execute(delete(RunRow).where(RunRow.id.in_(chunk)))
        total += int(getattr(done, "rowcount", 0) or 0)
    return total


def _summary(row: Any) -> RunSummary:
    (id_, status, mode, library, question, outcome, answer, error, background, created, started,
     finished, total_s, model_s, tool_s, n_turns, n_images) = tuple(row)
    return RunSummary(id=id_, status=status, mode=mode, library=library, question=question,
                      outcome=outcome, answer=answer, error=error, background=bool(background),
                      created_at=created, started_at=started, finished_at=finished, total_s=total_s,
                      model_s=model_s, tool_s=tool_s, turns=n_turns, images=n_images)


def _box(value: Any) -> tuple[int, int, int, int] | None:
    return (int(value[0]), int(value[1]), int(value[2]), int(value[3])) if value else None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def finite(value: Any) -> Any:
    """JSON that every backend takes: PostgreSQL refuses NaN and infinities (kept as null)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value

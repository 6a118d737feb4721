"""The run store on SQLAlchemy 2 (async): one implementation for SQLite (aiosqlite) and PostgreSQL
(asyncpg). Writes are small and per event (a run's start, each turn, its end), so a crash loses at most
the turn in flight. Runs in flight belong to the server instance running them (``owner``); an instance
that stops beating (or, on the same host, whose process is gone) has its runs marked ``interrupted`` by
the next instance that looks (at start-up and at every heartbeat)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from sqlalchemy import ColumnElement, and_, delete, func, insert, or_, select, true, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, async_sessionmaker

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
_SUMMARY = (RunRow.id, RunRow.status, RunRow.mode, RunRow.library, RunRow.question, RunRow.outcome,
            RunRow.answer, RunRow.error, RunRow.background, RunRow.created_at, RunRow.started_at,
            RunRow.finished_at, RunRow.total_s, RunRow.model_s, RunRow.tool_s, RunRow.n_turns,
            RunRow.n_images)


class SqlRunStore:
    def __init__(self, engine: AsyncEngine, *, max_runs: int = 0, ttl_s: float = 0.0,
                 stale_s: float = 30.0) -> None:
        self.engine = engine
        self.backend = engine.dialect.name
        self.max_runs, self.ttl_s, self.stale_s = max_runs, ttl_s, stale_s
        self.instance = uuid.uuid4().hex
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)
        # SQLite has one writer at a time: queue this process's writers here rather than in busy retries.
        self._write_lock = asyncio.Lock() if self.backend == "sqlite" else None

    @contextlib.asynccontextmanager
    async def _write(self) -> AsyncIterator[AsyncConnection]:
        # A plain connection (no ORM session): a turn's write is two Core statements in one transaction.
        async with self._write_lock or contextlib.nullcontext(), self.engine.begin() as conn:
            yield conn

    # ---- writing a run ----------------------------------------------------------------------------
    async def create(self, run: NewRun, status: Status) -> None:
        now = time.time()
        async with self._write() as s:
            await s.execute(insert(RunRow).values(
                id=run.id, status=status, mode=run.mode, library=run.library, question=run.question,
                background=run.background, owner=self.instance, created_at=now,
                started_at=now if status == "running" else None, n_turns=0, n_images=0,
                options=finite(run.options)))

    async def add_images(self, run_id: str, images: list[tuple[int, ImageBlob]]) -> None:
        if not images:
            return
        async with self._write() as s:
            await s.execute(insert(ImageRow), [
                {"run_id": run_id, "n": n, "media_type": b.media_type, "width": b.width,
                 "height": b.height, "source": b.source, "parent": b.parent,
                 "box": list(b.box) if b.box else None, "data": b.data}
                for n, b in images])
            await s.execute(update(RunRow).where(RunRow.id == run_id)
                            .values(n_images=RunRow.n_images + len(images)))

    async def add_turn(self, run_id: str, turn: dict[str, Any]) -> None:
        index = int(turn["index"])
        async with self._write() as s:
            await s.execute(insert(TurnRow).values(run_id=run_id, idx=index, data=finite(turn)))
            await s.execute(update(RunRow).where(RunRow.id == run_id).values(n_turns=index + 1))

    async def set_status(self, run_id: str, status: Status) -> None:
        values: dict[str, Any] = {"status": status}
        if status == "running":
            values["started_at"] = time.time()
        async with self._write() as s:
            await s.execute(update(RunRow).where(RunRow.id == run_id).values(**values))

    async def finish(self, run_id: str, status: Status, *, outcome: str | None, answer: str | None,
                     error: str | None, timings: dict[str, float] | None,
                     usage: dict[str, int] | None) -> None:
        t = timings or {}
        async with self._write() as s:
            await s.execute(update(RunRow).where(RunRow.id == run_id).values(
                status=status, outcome=outcome, answer=answer, error=error, finished_at=time.time(),
                total_s=t.get("total_s"), model_s=t.get("model_s"), tool_s=t.get("tool_s"), usage=usage))

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
        async with self._write() as s:
            return await _delete_runs(s, [run_id]) > 0

    # ---- the store's life -------------------------------------------------------------------------
    async def register(self) -> int:
        """This instance joins (its heartbeat row); the runs of instances found dead become
        ``interrupted``; how many did."""
        now = time.time()
        async with self._write() as s:
            await s.execute(insert(ServerRow).values(id=self.instance, hostname=HOSTNAME, pid=os.getpid(),
                                                     started_at=now, seen_at=now))
        return await self.recover()

    async def heartbeat(self) -> int:
        """This instance is alive (re-joining if it was taken for dead); then ``recover``."""
        now = time.time()
        async with self._write() as s:
            done = await s.execute(update(ServerRow).where(ServerRow.id == self.instance).values(seen_at=now))
            if not getattr(done, "rowcount", 1):
                await s.execute(insert(ServerRow).values(id=self.instance, hostname=HOSTNAME,
                                                         pid=os.getpid(), started_at=now, seen_at=now))
        return await self.recover()

    async def recover(self) -> int:
        """Runs in flight whose instance is gone (no heartbeat for ``stale_s``, or, on this host, its
        process has exited) become ``interrupted``, their finished turns kept; how many."""
        now = time.time()
        async with self._write() as s:
            servers = (await s.execute(select(ServerRow.id, ServerRow.hostname, ServerRow.pid,
                                              ServerRow.seen_at))).all()
            dead = [r.id for r in servers if r.id != self.instance and (
                r.seen_at < now - self.stale_s or (r.hostname == HOSTNAME and not _pid_alive(r.pid)))]
            alive = [r.id for r in servers if r.id not in dead]
            owner_gone = or_(RunRow.owner.is_(None), RunRow.owner.not_in(alive)) if alive else true()
            done = await s.execute(update(RunRow).where(RunRow.status.in_(ACTIVE), owner_gone).values(
                status="interrupted", error=INTERRUPTED, finished_at=now))
            if dead:
                await s.execute(delete(ServerRow).where(ServerRow.id.in_(dead)))
        return int(getattr(done, "rowcount", 0) or 0)

    async def sweep(self) -> int:
        """Retention: finished runs older than ``ttl_s``, and beyond the newest ``max_runs``, are
        deleted (runs in flight never); how many."""
        finished = RunRow.status.not_in(ACTIVE)
        gone = 0
        async with self._write() as s:
            if self.ttl_s > 0:
                old = (await s.execute(select(RunRow.id).where(
                    finished, RunRow.created_at < time.time() - self.ttl_s))).scalars().all()
                gone += await _delete_runs(s, list(old))
            if self.max_runs > 0:
                count = (await s.execute(select(func.count()).select_from(RunRow))).scalar() or 0
                if count > self.max_runs:
                    extra = (await s.execute(select(RunRow.id).where(finished)
                                             .order_by(RunRow.created_at.asc(), RunRow.id.asc())
                                             .limit(count - self.max_runs))).scalars().all()
                    gone += await _delete_runs(s, list(extra))
        return gone

    async def close(self) -> None:
        """Leave (this instance's row goes: its runs are all finished or written off by now)."""
        try:
            async with self._write() as s:
                await s.execute(delete(ServerRow).where(ServerRow.id == self.instance))
        finally:
            await self.engine.dispose()


async def _delete_runs(s: AsyncConnection, ids: list[str]) -> int:
    total = 0
    for i in range(0, len(ids), 500):  # bounded IN lists
        chunk = ids[i:i + 500]
        await s.execute(delete(TurnRow).where(TurnRow.run_id.in_(chunk)))
        await s.execute(delete(ImageRow).where(ImageRow.run_id.in_(chunk)))
        done = await s.execute(delete(RunRow).where(RunRow.id.in_(chunk)))
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

"""Admission control: at most N runs at once, a bounded queue behind them, 429 beyond that.

Like SGLang's --max-running-requests / --max-queued-requests: a request that would wait in a full
queue is refused at once with Retry-After rather than piling up; one that is admitted always ends
with an explicit outcome. ``drain`` stops admitting and waits for what is in flight (graceful stop);
``expire`` ends what is still in flight when the drain's deadline has passed: every task bound to a
ticket (the run, or the request serving one step) and every request still queued is cancelled, and
the cancellation surfaces as ``ShuttingDown`` (a JSON 503) rather than as a bare cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol, TypeVar

from starlette.types import ASGIApp, Receive, Scope, Send

from ssr_server.api.errors import error_response, retry_headers
from ssr_server.core import metrics
from ssr_server.core.errors import Overloaded, ShuttingDown

T = TypeVar("T")
_EXPIRED = "the server shut down before the run finished; retry on another replica"


class Admission:
    def __init__(self, max_running: int, max_queued: int) -> None:
        self.max_running = max_running
        self.max_queued = max_queued
        self.running = 0
        self.queued = 0
        self.draining = False
        self.expired = False  # the drain's deadline passed: nothing admitted may go on
        self._sem = asyncio.Semaphore(max_running)
        self._idle = asyncio.Event()
        self._idle.set()
        self._recent_s = 1.0  # moving average of run time, for Retry-After
        self._bound: set[asyncio.Task[object]] = set()  # tasks doing admitted work
        self._waiting: set[asyncio.Task[object]] = set()  # tasks queued in acquire
        self._cut: set[asyncio.Task[object]] = set()  # tasks that expire() cancelled

    def check(self) -> None:
        """Raise what ``acquire`` would refuse with right now (``ShuttingDown``, ``Overloaded``)."""
        if self.draining:
            metrics.REQUESTS_REJECTED.labels(reason="shutting_down").inc()
            raise ShuttingDown("the server is shutting down; retry on another replica")
        if self.running >= self.max_running and self.queued >= self.max_queued:
            wait = self._recent_s * (1 + self.queued) / max(1, self.max_running)
            raise Overloaded(f"{self.running} runs in flight and {self.queued} queued; retry later",
                             retry_after_s=max(1.0, wait))

    async def acquire(self) -> Ticket:
        """Wait for a slot (in the bounded queue), or refuse at once when the queue is full."""
        self.check()
        self._idle.clear()
        self.queued += 1
        me = asyncio.current_task()
        if me is not None:
            self._waiting.add(me)
        try:
            await self._sem.acquire()
        except BaseException:  # cancelled while queued (client gone, shutdown)
            self.queued -= 1
            self._maybe_idle()
            if me is not None and self._was_cut(me):
                raise ShuttingDown(_EXPIRED) from None
            raise
        finally:
            if me is not None:
                self._waiting.discard(me)
        self.queued -= 1
        self.running += 1
        return Ticket(self)

    def _release(self, started: float) -> None:
        self.running -= 1
        self._sem.release()
        self._recent_s = 0.8 * self._recent_s + 0.2 * (time.perf_counter() - started)
        self._maybe_idle()

    def _maybe_idle(self) -> None:
        if self.running == 0 and self.queued == 0:
            self._idle.set()

    def _was_cut(self, task: asyncio.Task[object]) -> bool:
        """True (and the cancellation taken back) when ``expire`` cancelled ``task``."""
        if task not in self._cut:
            return False
        self._cut.discard(task)
        task.uncancel()
        return True

    def _cancel(self, task: asyncio.Task[object]) -> None:
        if not task.done():
            self._cut.add(task)
            task.cancel()

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[Ticket]:
        """A slot for work done by the current task itself (e.g. one selection step)."""
        ticket = await self.acquire()
        me = asyncio.current_task()
        try:
            if me is not None:
                ticket.bind(me)
            yield ticket
        except asyncio.CancelledError:
            cut = me is not None and self._was_cut(me)
            ticket.release()
            if cut:
                raise ShuttingDown(_EXPIRED) from None
            raise
        finally:
            ticket.release()

    async def drain(self, timeout_s: float) -> bool:
        """Stop admitting; True when everything in flight finished within the timeout."""
        self.draining = True
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
            return True
        except TimeoutError:
            return False

    def expire(self) -> int:
        """The drain's deadline passed: cancel every admitted or queued task; how many there were."""
        self.draining = self.expired = True
        victims = [t for t in (*self._bound, *self._waiting) if not t.done()]
        for task in victims:
            self._cancel(task)
        return len(victims)


class AdmissionGate:
    """ASGI middleware: refuse a run or selection step (429, or 503 while draining) before its body is
    read, when ``Admission`` would refuse it anyway. Under overload the refused bodies are then never
    held in memory (each is read and dropped chunk by chunk, so that the client, still sending,
    receives the answer); the route's own ``acquire`` stays the real decision."""

    def __init__(self, app: ASGIApp, admission: Callable[[], Admission | None],
                 paths: frozenset[str]) -> None:
        self.app, self.admission, self.paths = app, admission, paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        adm = self.admission() if scope["type"] == "http" and scope["path"] in self.paths else None
        if adm is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        try:
            adm.check()
        except (Overloaded, ShuttingDown) as exc:
            if isinstance(exc, Overloaded):
                metrics.REQUESTS_REJECTED.labels(reason="overloaded").inc()
            more = True
            while more:  # drop the body as it arrives
                message = await receive()
                more = message["type"] == "http.request" and bool(message.get("more_body"))
            resp = error_response(exc.status_code, exc.code, exc.message, headers=retry_headers(exc),
                                  path=scope["path"])
            await resp(scope, receive, send)
            return
        await self.app(scope, receive, send)


class Ticket:
    """One admitted run's slot; ``release`` is idempotent (safe from a task's done-callback)."""

    def __init__(self, admission: Admission) -> None:
        self._owner = admission
        self._released = False
        self._started = time.perf_counter()
        self._tasks: list[asyncio.Task[object]] = []

    def bind(self, task: asyncio.Task[T]) -> None:
        """``task`` does this run's work: ``expire`` cancels it (at once if the deadline has passed)."""
        if self._released:
            return
        t: asyncio.Task[object] = task  # type: ignore[assignment]
        self._tasks.append(t)
        self._owner._bound.add(t)
        if self._owner.expired:
            self._owner._cancel(t)

    async def guard(self, work: Awaitable[T]) -> T:
        """Await ``work`` (e.g. image intake) under this ticket: if it fails, the slot is freed; if
        the drain's deadline cancels it, ``ShuttingDown`` is raised instead of the cancellation."""
        me = asyncio.current_task()
        if me is not None:
            self.bind(me)
        try:
            return await work
        except asyncio.CancelledError:
            cut = me is not None and self._owner._was_cut(me)
            self.release()
            if cut:
                raise ShuttingDown(_EXPIRED) from None
            raise
        except BaseException:
            self.release()
            raise
        finally:
            if me is not None and me in self._tasks:
                self._tasks.remove(me)
                self._owner._bound.discard(me)

    def release(self, *_: object) -> None:
        if self._released:
            return
        self._released = True
        for t in self._tasks:
            self._owner._bound.discard(t)
            self._owner._cut.discard(t)
        self._tasks.clear()
        self._owner._release(self._started)


class SupportsDisconnect(Protocol):
    async def is_disconnected(self) -> bool: ...


async def acquire_or_disconnect(admission: Admission, request: SupportsDisconnect) -> Ticket | None:
    """Wait for an admission slot; a client that goes away while queued gives its place back (None)."""
    acquiring = asyncio.ensure_future(admission.acquire())
    try:
        while True:
            done, _ = await asyncio.wait({acquiring}, timeout=0.25)
            if done:
                return acquiring.result()  # Overloaded / ShuttingDown propagate
            if await request.is_disconnected():
                break
    except BaseException:
        _abandon(acquiring)
        raise
    _abandon(acquiring)
    metrics.REQUESTS_REJECTED.labels(reason="client_disconnected").inc()
    return None


def _abandon(acquiring: asyncio.Future[Ticket]) -> None:
    if acquiring.cancel():  # still queued: Admission.acquire gives the place back
        return
    if not acquiring.cancelled() and acquiring.exception() is None:
        acquiring.result().release()  # admitted meanwhile, but nobody will use the slot

"""Admission control: at most N runs at once, a bounded queue behind them, 429 beyond that.

Like SGLang's --max-running-requests / --max-queued-requests: a request that would wait in a full
queue is refused at once with Retry-After rather than piling up; one that is admitted always ends
with an explicit outcome. ``drain`` stops admitting and waits for what is in flight (graceful stop);
``expire`` ends what is still in flight when the drain's deadline has passed: every task bound to a
ticket (the run, or the request serving one step) and every request still queued is cancelled, and
the cancellation surfaces as ``ShuttingDown`` (a JSON 503) rather than as a bare cancellation.

The slot is taken from the request's headers, before a byte of its body is read (``api.gate``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from ssr_server.core import metrics
from ssr_server.core.errors import Overloaded, ShuttingDown

T = TypeVar("T")
EXPIRED = "the server shut down before the run finished; retry on another replica"


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

    def would_queue(self) -> bool:
        """``acquire`` would wait in the queue (rather than admit or refuse at once)."""
        return not self.draining and self._sem.locked() and self.queued < self.max_queued

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
            if me is not None and self.was_cut(me):
                raise ShuttingDown(EXPIRED) from None
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

    def was_cut(self, task: asyncio.Task[object]) -> bool:
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
        async with ticket.hold():
            yield ticket

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


class Ticket:
    """One admitted request's slot; ``release`` is idempotent (safe from a task's done-callback)."""

    def __init__(self, admission: Admission) -> None:
        self._owner = admission
        self._released = False
        self.claimed = False  # the route took it from the gate (its serving code gives it back)
        self._started = time.perf_counter()
        self._tasks: list[asyncio.Task[object]] = []

    def claim(self) -> Ticket:
        """The route takes the slot the gate holds: from here on, its serving code gives it back
        (``guard``, ``hold``, a run task's done-callback), as if it had acquired the slot itself."""
        self.claimed = True
        me = asyncio.current_task()
        if me is not None:
            self.unbind(me)  # the gate's binding of the request task ends here
        return self

    def bind(self, task: asyncio.Task[T]) -> None:
        """``task`` does this run's work: ``expire`` cancels it (at once if the deadline has passed)."""
        t: asyncio.Task[object] = task  # type: ignore[assignment]
        if self._released or t in self._tasks:
            return
        self._tasks.append(t)
        self._owner._bound.add(t)
        if self._owner.expired:
            self._owner._cancel(t)

    def unbind(self, task: asyncio.Task[T]) -> None:
        t: asyncio.Task[object] = task  # type: ignore[assignment]
        if t in self._tasks:
            self._tasks.remove(t)
            self._owner._bound.discard(t)

    async def guard(self, work: Awaitable[T]) -> T:
        """Await ``work`` (e.g. image intake) under this ticket: if it fails, the slot is freed; if
        the drain's deadline cancels it, ``ShuttingDown`` is raised instead of the cancellation."""
        me = asyncio.current_task()
        if me is not None:
            self.bind(me)
        try:
            return await work
        except asyncio.CancelledError:
            self._release_cancelled(me)
            raise
        except BaseException:
            self.release()
            raise
        finally:
            if me is not None:
                self.unbind(me)

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[Ticket]:
        """Work done by the current task itself under this ticket (e.g. one selection step): the drain's
        deadline cancels it (``ShuttingDown``), and the slot is given back when the block ends."""
        me = asyncio.current_task()
        try:
            if me is not None:
                self.bind(me)
            yield self
        except asyncio.CancelledError:
            self._release_cancelled(me)
            raise
        finally:
            self.release()

    def _release_cancelled(self, me: asyncio.Task[Any] | None) -> None:
        """Free the slot of work that was cancelled; raise ``ShuttingDown`` if the drain's deadline cut it."""
        cut = me is not None and self._owner.was_cut(me)
        self.release()
        if cut:
            raise ShuttingDown(EXPIRED) from None

    def release(self, *_: object) -> None:
        if self._released:
            return
        self._released = True
        for t in self._tasks:
            self._owner._bound.discard(t)
            self._owner._cut.discard(t)
        self._tasks.clear()
        self._owner._release(self._started)

"""Admission control: at most N runs at once, a bounded queue behind them, 429 beyond that.

Like SGLang's --max-running-requests / --max-queued-requests: a request that would wait in a full
queue is refused at once with Retry-After rather than piling up; one that is admitted always ends
with an explicit outcome. ``drain`` stops admitting and waits for what is in flight (graceful stop).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from ssr_server import metrics
from ssr_server.errors import Overloaded, ShuttingDown


class Admission:
    def __init__(self, max_running: int, max_queued: int) -> None:
        self.max_running = max_running
        self.max_queued = max_queued
        self.running = 0
        self.queued = 0
        self.draining = False
        self._sem = asyncio.Semaphore(max_running)
        self._idle = asyncio.Event()
        self._idle.set()
        self._recent_s = 1.0  # moving average of run time, for Retry-After

    async def acquire(self) -> Ticket:
        """Wait for a slot (in the bounded queue), or refuse at once when the queue is full."""
        if self.draining:
            metrics.REQUESTS_REJECTED.labels(reason="shutting_down").inc()
            raise ShuttingDown("the server is shutting down; retry on another replica")
        if self.running >= self.max_running and self.queued >= self.max_queued:
            wait = self._recent_s * (1 + self.queued) / max(1, self.max_running)
            raise Overloaded(f"{self.running} runs in flight and {self.queued} queued; retry later",
                             retry_after_s=max(1.0, wait))
        self._idle.clear()
        self.queued += 1
        try:
            await self._sem.acquire()
        except BaseException:  # cancelled while queued (client gone, shutdown)
            self.queued -= 1
            self._maybe_idle()
            raise
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

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        ticket = await self.acquire()
        try:
            yield
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


class Ticket:
    """One admitted run's slot; ``release`` is idempotent (safe from a task's done-callback)."""

    def __init__(self, admission: Admission) -> None:
        self._admission: Admission | None = admission
        self._started = time.perf_counter()

    def release(self, *_: object) -> None:
        if self._admission is not None:
            admission, self._admission = self._admission, None
            admission._release(self._started)

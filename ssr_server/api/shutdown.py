"""Graceful shutdown: the socket stays open while the app drains, then the process goes.

The first SIGTERM (or SIGINT) starts the app's drain and nothing else: ``/ready`` answers 503 at once,
new runs are answered 503 ``shutting_down`` with Retry-After (so a client or load balancer that still
sends here gets an answer, not a refused connection), and runs in flight go on. At the drain's deadline
whatever still runs is cancelled and answered with a JSON 503 (a final ``error`` event on a stream);
once those answers are written the server stops listening and exits. A second signal exits at once.

uvicorn alone would close the socket at the first signal and, past its graceful timeout, cancel the
request tasks (a text/plain 500) while the agent's run tasks go on computing. The bounds on slow and
idle clients are in ``api.connections``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from types import FrameType

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from ssr_server.api.admission import Admission

log = logging.getLogger(__name__)

SETTLE_S = 2.0  # after the deadline: time for the cancelled runs' answers to be written
GRACEFUL_S = 1  # then uvicorn's own wait for connections (all idle by then)
# The process is gone within drain timeout + this (settle, uvicorn's wait, closing the engine and tools,
# interpreter exit); deploy/ sizes its grace periods on it.
EXIT_MARGIN_S = 5


class RequestCounter:
    """HTTP requests whose response is not yet fully sent (counted by ``CountRequests``)."""

    def __init__(self) -> None:
        self.count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def enter(self) -> None:
        self.count += 1
        self._idle.clear()

    def leave(self) -> None:
        self.count -= 1
        if self.count == 0:
            self._idle.set()

    async def wait_idle(self, timeout_s: float) -> bool:
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
            return True
        except TimeoutError:
            return False


class CountRequests:
    """ASGI middleware feeding a ``RequestCounter``."""

    def __init__(self, app: ASGIApp, counter: RequestCounter) -> None:
        self.app, self.counter = app, counter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.counter.enter()
        try:
            await self.app(scope, receive, send)
        finally:
            self.counter.leave()


class Drain:
    """The app's drain, run once however many times it is asked for (signal, then lifespan)."""

    def __init__(self, admission: Admission, requests: RequestCounter, timeout_s: float) -> None:
        self.admission, self.requests, self.timeout_s = admission, requests, timeout_s
        self._task: asyncio.Task[bool] | None = None

    def start(self) -> asyncio.Task[bool]:
        if self._task is None:
            self.admission.draining = True  # /ready says so from now on
            self._task = asyncio.create_task(self._run(), name="ssr-drain")
        return self._task

    async def wait(self) -> bool:
        """Start (if need be) and wait; True when nothing had to be cancelled."""
        return await asyncio.shield(self.start())

    async def _run(self) -> bool:
        adm = self.admission
        clean = await adm.drain(self.timeout_s)
        if not clean:
            cut = adm.expire()
            log.warning("shutdown: %d runs still in flight after the %g s drain were cancelled", cut,
                        self.timeout_s)
            await adm.drain(SETTLE_S)
        # The runs' answers (the JSON 503s and final stream events included) are fully written.
        if not await self.requests.wait_idle(SETTLE_S):
            log.warning("shutdown: %d requests still open after the drain", self.requests.count)
        return clean


class DrainingServer(uvicorn.Server):
    """uvicorn's server whose first exit signal drains the app before it stops listening."""

    def __init__(self, config: uvicorn.Config, drain: Callable[[], Awaitable[object]]) -> None:
        super().__init__(config)
        self._drain = drain
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task[None] | None = None
        self.draining = False

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Runs in the signal handler (main thread) or, in tests, in any thread: only flags and a
        # thread-safe hand-over to the event loop.
        if self.draining or self._loop is None or not self.started:
            self.force_exit = self.draining  # a second signal: no more waiting of any kind
            self.should_exit = True
            return
        self.draining = True
        log.info("signal %d: draining (a second signal exits at once)", sig)
        self._loop.call_soon_threadsafe(self._begin)

    def _begin(self) -> None:
        self._drain_task = asyncio.create_task(self._drain_then_exit(), name="ssr-drain-then-exit")

    async def _drain_then_exit(self) -> None:
        try:
            await self._drain()
        except Exception:
            log.exception("the drain failed; stopping anyway")
        finally:
            self.should_exit = True

"""The server's side of slow and idle clients: uvicorn (0.55) bounds neither the time nor the size of a
request's headers, and leaves a connection open forever once it has answered before the body arrived.
``GuardedHttp`` is its httptools protocol with those bounds; ``server_config`` is the one uvicorn config
that ``ssr-server serve``, the benchmarks and the tests' servers all use.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ssr_server.api.gate import CONNECTION_LOST
from ssr_server.api.shutdown import GRACEFUL_S
from ssr_server.core import metrics
from ssr_server.core.config import Settings


class GuardedHttp(HttpToolsProtocol):
    """uvicorn's httptools protocol with the bounds it lacks (uvicorn 0.55, measured):

    - a request's line and headers must arrive within ``header_timeout_s`` of the connection opening or
      of the first byte after the last request, else the connection is closed (uvicorn has none: a client
      sending a header byte a second, or nothing at all, was never closed), and may not exceed
      ``max_header_bytes`` (431; uvicorn took 2 MB of headers without a word);
    - after an answer sent before the body arrived (a 429 from the headers), the rest of the body is
      discarded as it streams (uvicorn's own ``on_body``) but must arrive within ``body_timeout_s``,
      else the connection is closed; once it has, the connection idles under the keep-alive timeout
      (uvicorn's timer was cancelled by the first byte of that body and never set again: the
      connection stayed open for good);
    - before the app asks for a body, at most ``HIGH_WATER`` + one read (16 KB, ``GuardedReads``) of it
      is read into memory, then reading pauses (uvicorn: 64 KB + its 256 KB reads, so that a burst of
      400 refused 300 KB bodies was nearly all read before the refusals: +40-50 MB of RSS, measured);
    - ``scope["extensions"][CONNECTION_LOST]``: an event set when the connection is gone, which the
      admission queue watches without reading the body (a queued client that leaves is noticed when
      its body fits under the high-water mark: past it, reading is paused until it is admitted).

    Subclassed per server by ``guarded_protocol`` with the settings' values."""

    header_timeout_s = 10.0
    body_timeout_s = 30.0
    keep_alive_s = 5.0
    max_header_bytes = 65_536
    HIGH_WATER = 16_384  # body bytes held before the app reads them

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_keep_alive = self.keep_alive_s  # type: ignore[assignment]  # uvicorn's is an int
        self.lost = asyncio.Event()
        self._head_timer: asyncio.TimerHandle | None = None
        self._rest_timer: asyncio.TimerHandle | None = None
        self._in_message = False  # between a request's first byte and the end of its body
        self._head_bytes = 0
        self._head_too_large = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._timed_out, "header")

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.lost.set()
        self._cancel_timers()

    def data_received(self, data: bytes) -> None:
        if not self._in_message and self._head_timer is None:
            # The first bytes of a request, or blank lines before one: its head must follow in time
            # (uvicorn's keep-alive timer, which any byte cancels, is no bound on a trickle).
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._timed_out, "header")
        super().data_received(data)

    def on_body(self, body: bytes) -> None:
        # uvicorn's, with the lower high-water mark
        if (self.parser.should_upgrade() and self._should_upgrade()) or self.cycle.response_complete:
            return
        self.cycle.body += body
        if len(self.cycle.body) > self.HIGH_WATER:
            self.flow.pause_reading()
        self.cycle.message_event.set()

    @property
    def discarding(self) -> bool:
        """Answered before the body arrived: what is left of the body is only read to be dropped."""
        return self._in_message and self.cycle is not None and self.cycle.response_complete

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_message = True
        self._head_bytes = 0
        extensions: dict[str, Any] = {**self.scope.get("extensions", {}), CONNECTION_LOST: self.lost}
        self.scope["extensions"] = extensions  # type: ignore[typeddict-item]  # uvicorn types its values
        # A request that follows a discarded body in the same read: the idle timer set when that body
        # ended (on_message_complete) must not run while this one is served.
        self._unset_keepalive_if_required()

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)
        super().on_header(name, value)

    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > self.max_header_bytes:
            self._head_too_large = True
            raise ValueError("request head too large")  # stops the parser: send_400_response below

    def send_400_response(self, msg: str) -> None:
        if not self._head_too_large:
            super().send_400_response(msg)
            return
        metrics.REQUESTS_REJECTED.labels(reason="headers_too_large").inc()
        text = f"request line and headers are over {self.max_header_bytes} bytes".encode()
        self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; "
                             b"charset=utf-8\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s"
                             % (len(text), text))
        self.transport.close()

    def on_headers_complete(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_message = False
        if self._rest_timer is not None:
            self._rest_timer.cancel()
            self._rest_timer = None
        super().on_message_complete()
        answered = self.cycle is not None and self.cycle.response_complete
        if (answered and not self.pipeline and self.timeout_keep_alive_task is None
                and not self.transport.is_closing()):
            self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive,
                                                                self.timeout_keep_alive_handler)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.discarding and not self.transport.is_closing():
            # Answered before the body arrived: the client may still be sending it (a plain client
            # writes its whole body before it reads), and gets the answer once it has. Bounded by the
            # body timeout rather than by the keep-alive timer, which the next byte cancels anyway.
            self._unset_keepalive_if_required()
            self._rest_timer = self.loop.call_later(self.body_timeout_s, self._timed_out, "body")
            self.cycle.body = bytearray()  # what was read of it before the answer: never wanted

    def _timed_out(self, what: str) -> None:
        if what == "header":
            self._head_timer = None
        else:
            self._rest_timer = None
        if self._in_message:  # an idle connection that never began a request is no rejected request
            metrics.REQUESTS_REJECTED.labels(reason=f"{what}_timeout").inc()
        if not self.transport.is_closing():
            self.transport.close()

    def _cancel_timers(self) -> None:
        for timer in (self._head_timer, self._rest_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._rest_timer = None


_buffers = threading.local()  # per event loop's thread: a read is consumed before the next begins


class GuardedReads(asyncio.BufferedProtocol):
    """What uvicorn instantiates per connection: reads the socket into the ``GuardedHttp`` it wraps, in
    16 KB pieces while a body may be wanted, in 256 KB ones while the rest of a refused body is discarded
    (16 KB there, 19 parser calls per 300 KB body, put the last 429 of a burst of 400 such requests at
    0.25 s instead of 0.09 s, measured with ``bench overload --admission``). uvloop reads
    256 KB at a time into any ``asyncio.Protocol`` (which uvicorn's are), whatever it asks for; only a
    protocol that is not one chooses its buffer."""

    http_class: type[GuardedHttp] = GuardedHttp
    SMALL, LARGE = 16_384, 262_144

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.http = self.http_class(*args, **kwargs)
        self._buffer = self._view(self.SMALL)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.http.connection_made(transport)  # type: ignore[arg-type]

    def connection_lost(self, exc: Exception | None) -> None:
        self.http.connection_lost(exc)

    def eof_received(self) -> bool | None:
        return self.http.eof_received()  # type: ignore[func-returns-value]

    def pause_writing(self) -> None:
        self.http.pause_writing()

    def resume_writing(self) -> None:
        self.http.resume_writing()

    def get_buffer(self, sizehint: int) -> memoryview:
        self._buffer = self._view(self.LARGE if self.http.discarding else self.SMALL)
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        # the parser copies what it keeps (httptools hands out bytes): no copy of the read itself
        self.http.data_received(self._buffer[:nbytes])  # type: ignore[arg-type]

    @staticmethod
    def _view(size: int) -> memoryview:
        view: memoryview | None = getattr(_buffers, f"b{size}", None)
        if view is None:
            view = memoryview(bytearray(size))
            setattr(_buffers, f"b{size}", view)
        return view


def guarded_protocol(settings: Settings) -> type[GuardedReads]:
    """``GuardedReads`` around a ``GuardedHttp`` with ``settings``' bounds (uvicorn builds its protocol
    from a class, called with its config and state)."""
    http = type("GuardedHttp", (GuardedHttp,), {
        "header_timeout_s": settings.header_timeout_s, "body_timeout_s": settings.body_timeout_s,
        "keep_alive_s": settings.keep_alive_s, "max_header_bytes": settings.max_header_bytes})
    return type("GuardedReads", (GuardedReads,), {"http_class": http})


def server_config(app: ASGIApp, settings: Settings, **overrides: Any) -> uvicorn.Config:
    """uvicorn's config for ``app`` with ``settings``' connection bounds: the guarded protocol, and at
    most ``max_connections`` connections (uvicorn answers a request on one more with a plain 503).
    ``overrides`` (host, port, log level, lifespan, ...) go to ``uvicorn.Config`` as they are."""
    options: dict[str, Any] = {
        "host": settings.host, "port": settings.port, "http": guarded_protocol(settings),
        "limit_concurrency": settings.max_connections, "timeout_graceful_shutdown": GRACEFUL_S}
    options.update(overrides)
    return uvicorn.Config(app, **options)

"""The FastAPI app factory: settings -> engine, tools, libraries, agent; middleware; lifespan."""

from __future__ import annotations

import asyncio
import copy
import hmac
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi_offline import FastAPIOffline
from starlette.types import ASGIApp, Receive, Scope, Send

from ssr_server import __version__
from ssr_server.agent.completion import Completer, ReasoningMemory
from ssr_server.agent.loop import Agent
from ssr_server.api.admission import Admission
from ssr_server.api.errors import error_response, install_error_handlers
from ssr_server.api.gate import AdmissionGate
from ssr_server.api.shutdown import CountRequests, Drain, RequestCounter
from ssr_server.api.state import AppState
from ssr_server.api.stats import LatencyWindow
from ssr_server.core import metrics, tracing
from ssr_server.core.config import Settings
from ssr_server.core.formats.format import get_format
from ssr_server.core.images.intake import return_freed_memory_to_the_os
from ssr_server.core.images.limits import ImageLimits
from ssr_server.core.library import LibraryRegistry
from ssr_server.core.logs import RequestLog
from ssr_server.core.protocol import Engine
from ssr_server.tools.registry import ToolRegistry, build_registry, demo_registry

log = logging.getLogger(__name__)


def build_tools(settings: Settings) -> ToolRegistry:
    if settings.searxng_url or settings.image_search_url or settings.corpus_path or settings.image_index_dir:
        return build_registry(searxng_url=settings.searxng_url, image_search_url=settings.image_search_url,
                              corpus_path=settings.corpus_path, image_index_dir=settings.image_index_dir,
                              default_timeout_s=settings.tool_timeout_s)
    return demo_registry(default_timeout_s=settings.tool_timeout_s)


# The routes that take an admission slot.
ADMITTED_PATHS = frozenset({"/v1/agent/runs", "/v1/ssr/select", "/v1/chat/completions"})


class BodyLimit:
    """413 for bodies over the limit, whether declared (Content-Length) or streamed (chunked)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(scope, receive, send)
            return
        seen, rejected, started = 0, False, False

        async def limited() -> Any:
            # Over the limit: answer 413 here and tell the app the client left, so that whatever
            # the app does with the cut body (FastAPI answers 400) is never sent.
            nonlocal seen, rejected
            if rejected:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                body = message.get("body", b"")
                seen += len(body) if isinstance(body, bytes | bytearray) else 0
                if seen > self.max_bytes:
                    rejected = True
                    if not started:
                        await self._reject(scope, receive, send)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Any) -> None:
            nonlocal started
            if rejected:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, limited, guarded_send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        metrics.REQUESTS_REJECTED.labels(reason="body_too_large").inc()
        resp = error_response(413, "payload_too_large", f"request body is over {self.max_bytes} bytes",
                              path=scope["path"])
        await resp(scope, receive, send)


class BodyDeadline:
    """408 for a body that has not arrived ``timeout_s`` after the app began to wait for it. Innermost,
    so that for an admitted route the clock starts once the request holds its slot (a queued request is
    not reading its body); the app then sees the client as gone and whatever it answers is dropped, and
    the slot goes back (``AdmissionGate``). The connection is closed: the rest of the body is not coming."""

    def __init__(self, app: ASGIApp, timeout_s: float) -> None:
        self.app, self.timeout_s = app, timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        whole, late, started = False, False, False

        async def timed() -> Any:
            nonlocal whole, late
            if late:
                return {"type": "http.disconnect"}
            if whole:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                late = True
                metrics.REQUESTS_REJECTED.labels(reason="body_timeout").inc()
                if not started:
                    why = f"the request body did not arrive within {self.timeout_s:g} s"
                    resp = error_response(408, "request_timeout", why, headers={"Connection": "close"},
                                          path=scope["path"])
                    await resp(scope, receive, send)
                return {"type": "http.disconnect"}
            whole = message["type"] != "http.request" or not message.get("more_body")
            return message

        async def guarded_send(message: Any) -> None:
            nonlocal started
            if late:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, timed, guarded_send)


class ApiKeyAuth:
    """Bearer API key on every path except the open ones (health, readiness, metrics by default)."""

    def __init__(self, app: ASGIApp, key: str, open_paths: tuple[str, ...]) -> None:
        self.app, self.key, self.open_paths = app, key.encode(), open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The run viewer's files are open (they hold no data; the page asks for the key to read runs).
        path = scope.get("path", "")
        if (scope["type"] != "http" or path in self.open_paths or scope["method"] == "OPTIONS"
                or path == "/ui" or path.startswith("/ui/")):
            await self.app(scope, receive, send)
            return
        auth = dict(scope.get("headers", [])).get(b"authorization", b"")
        scheme, _, token = auth.partition(b" ")
        if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.key):
            metrics.REQUESTS_REJECTED.labels(reason="unauthorized").inc()
            resp = error_response(401, "unauthorized", "missing or wrong API key (Authorization: Bearer ...)",
                                  headers={"WWW-Authenticate": "Bearer"}, path=scope["path"])
            await resp(scope, receive, send)
            return
        await self.app(scope, receive, send)


def create_app(settings: Settings | None = None, engine: Engine | None = None,
               tools: ToolRegistry | None = None) -> FastAPI:
    """The app; ``engine``/``tools`` may be injected (tests share one loaded model between apps)."""
    settings = settings or Settings()
    requests = RequestCounter()
    tracing.configure()  # from the OTEL_* variables; off (and never imported) without them

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        from ssr_server.engine.factory import build_engine
        from ssr_server.store.backends import keep_alive, open_store

        eng: Engine = engine if engine is not None else await asyncio.to_thread(build_engine, settings)
        tl: ToolRegistry = tools if tools is not None else await asyncio.to_thread(build_tools, settings)
        libs = LibraryRegistry(settings.library_dirs)
        libs.get(settings.default_library)  # fail at start, not at the first request
        return_freed_memory_to_the_os()  # decoded images are large, short-lived buffers
        admission = Admission(settings.max_concurrent_runs, settings.max_queued_runs)
        fmt = get_format(settings.prompt_format, settings.format_dirs)
        agent = Agent(eng, tl, libs, fmt)
        state = AppState(
            settings=settings, engine=eng, agent=agent, libraries=libs, tools=tl,
            admission=admission, stats=LatencyWindow(settings.stats_window),
            image_limits=ImageLimits(
                max_bytes=settings.max_image_bytes, max_pixels=settings.max_image_pixels,
                allow_private=settings.allow_private_urls, allowlist=settings.url_allowlist,
                timeout_s=settings.url_timeout_s, max_redirects=settings.url_max_redirects,
                keep_pixels=settings.image_keep_pixels,
                decode_slots=asyncio.Semaphore(settings.image_decode_concurrency)),
            http=httpx.AsyncClient(follow_redirects=False, trust_env=False),
            drain=Drain(admission, requests, settings.drain_timeout_s),
            completer=Completer(agent), reasoning_memory=ReasoningMemory(settings.reasoning_memory_size),
            started=int(time.time()),
        )
        # The run store (None when SSR_RUN_STORE=off): opened, migrated, and runs left in flight by a
        # dead server marked interrupted, before the first request.
        state.store = await open_store(settings)
        keeper = None if state.store is None else asyncio.create_task(
            keep_alive(state.store, settings.run_store_heartbeat_s), name="ssr-run-store")
        app.state.ssr = state
        log.info("ssr-server ready: engine=%s", eng.name)
        try:
            yield
        finally:
            # Already done when `ssr-server serve` drained on the signal; under a plain uvicorn, here.
            await state.drain.wait()  # background runs included: they hold admission slots
            if keeper is not None:
                keeper.cancel()
            if state.store is not None:
                await state.store.close()
            await state.http.aclose()
            tracing.flush(timeout_s=1.0)  # bounded: the process must be gone within EXIT_MARGIN_S
            if tools is None:
                await tl.aclose()
            if engine is None:
                await eng.close()

    # FastAPIOffline: /docs and /redoc load Swagger UI and ReDoc from files in the installed package
    # (no CDN), so the API docs also work on a machine without internet access.
    app = FastAPIOffline(title="ssr-server", version=__version__, lifespan=lifespan,
                         static_url="/docs-assets", swagger_ui_parameters={"validatorUrl": None},
                         description=("Selection-based structured reasoning for small multimodal search"
                                      " agents."))
    install_error_handlers(app)
    from ssr_server.api import ops
    from ssr_server.api.openai import router as openai
    from ssr_server.api.rest import router as rest
    from ssr_server.api.runs import router as runs

    app.include_router(ops.router)
    app.include_router(rest.router)
    app.include_router(runs.router)
    app.include_router(openai.router)
    runs.mount_viewer(app)
    _describe_the_server(app)

    def admission() -> Admission | None:
        state: AppState | None = getattr(app.state, "ssr", None)
        return None if state is None else state.admission

    app.add_middleware(BodyDeadline, timeout_s=settings.body_timeout_s)  # innermost: after admission
    app.add_middleware(AdmissionGate, admission=admission, paths=ADMITTED_PATHS)
    if settings.api_key is not None and settings.api_key.get_secret_value():
        app.add_middleware(ApiKeyAuth, key=settings.api_key.get_secret_value(),
                           open_paths=settings.open_paths)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(CountRequests, counter=requests)  # outermost: every answer counts until sent
    if settings.log_format == "json":
        app.add_middleware(RequestLog)
    tracing.instrument_app(app)  # the server span, around all of the above
    return app


def _describe_the_server(app: FastAPI) -> None:
    """``/openapi.json`` names what only the running server knows (the model it serves, its libraries),
    so that a client or test generator working from the document can form a valid chat completion;
    before start-up (no state yet) it is the generic document."""
    from ssr_server.api.openai.protocol import describe_server
    from ssr_server.api.openai.serving import model_name

    generic = app.openapi
    described: list[dict[str, Any]] = []

    def openapi() -> dict[str, Any]:
        doc = generic()  # FastAPI builds it once and keeps it
        state: AppState | None = getattr(app.state, "ssr", None)
        if state is None:
            return doc
        if not described:
            described.append(describe_server(copy.deepcopy(doc), model_name(state), state.libraries.names()))
        return described[0]

    app.openapi = openapi  # type: ignore[method-assign]


async def drain_app(app: FastAPI) -> bool:
    """Drain a started app (see ``api/shutdown.py``); True when no run had to be cancelled."""
    state: AppState | None = getattr(app.state, "ssr", None)
    return True if state is None else await state.drain.wait()

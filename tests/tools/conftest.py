"""Fixtures for the tool tests: the demo world (the benchmark world's preset) on disk, and a real local
HTTP server.

The server is uvicorn serving a small FastAPI app on 127.0.0.1 in a background thread. It speaks
SearxNG's JSON API (answering from the demo corpus) and the image search contract (answering from the
demo image index), plus broken variants of both: HTTP 500, non-JSON bodies, JSON without results,
and slow answers.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from PIL import Image

from ssr_server.tools.demo import DemoWorld, shipped_demo_world
from ssr_server.tools.image_search import LocalImageIndex
from ssr_server.tools.text_search import tokenize

SLOW_S = 1.5


@pytest.fixture(scope="session")
def demo_assets() -> DemoWorld:
    """The demo world the server ships."""
    return shipped_demo_world()


def _searx_results(query: str) -> list[dict[str, object]]:
    """Rank demo documents by shared words, shaped like SearxNG's ``results`` entries."""
    q = set(tokenize(query))
    scored = []
    for doc in shipped_demo_world().documents():
        overlap = len(q & set(tokenize(f"{doc['title']} {doc['text']}")))
        if overlap:
            scored.append((overlap, doc))
    scored.sort(key=lambda t: -t[0])
    return [
        {"title": d["title"], "url": d["url"], "content": d["text"], "engine": "demo", "score": float(s),
         "engines": ["demo"], "category": "general"}
        for s, d in scored
    ]


def make_app(index: LocalImageIndex) -> FastAPI:
    app = FastAPI()
    seen: list[dict[str, str]] = []
    app.state.seen = seen

    @app.get("/searx/search")
    async def searx(request: Request) -> Response:
        params = dict(request.query_params)
        seen.append(params)
        if params.get("format") != "json":
            return PlainTextResponse("<html>results</html>")
        q = params.get("q", "")
        results = _searx_results(q)
        return JSONResponse({"query": q, "number_of_results": len(results), "results": results,
                             "answers": [], "suggestions": [], "unresponsive_engines": []})

    @app.post("/images/search")
    async def images(request: Request) -> Response:
        body = await request.json()
        if not isinstance(body, dict) or not isinstance(body.get("image"), str):
            raise HTTPException(status_code=422, detail="image missing")
        img = Image.open(io.BytesIO(base64.b64decode(body["image"]))).convert("RGB")
        k = int(body.get("k", 3))
        thumb = io.BytesIO()
        img.resize((32, 24)).save(thumb, format="PNG")  # the query itself, small: a real thumbnail
        hits = [
            {"title": h.title, "description": h.description, "url": h.url, "score": round(1 - d, 4),
             "thumbnail": base64.b64encode(thumb.getvalue()).decode()}
            for d, h in index.distances(img)[:k] if d <= index.max_distance
        ]
        return JSONResponse({"results": hits})

    @app.api_route("/broken/search", methods=["GET", "POST"])
    async def broken() -> Response:
        return PlainTextResponse("internal error", status_code=500)

    @app.api_route("/forbidden/search", methods=["GET", "POST"])
    async def forbidden() -> Response:
        return PlainTextResponse("Forbidden", status_code=403)

    @app.api_route("/badjson/search", methods=["GET", "POST"])
    async def badjson() -> Response:
        return Response(b"{not json", media_type="application/json")

    @app.api_route("/noresults/search", methods=["GET", "POST"])
    async def noresults() -> Response:
        return JSONResponse({"query": "x", "answers": []})

    @app.api_route("/mixed/search", methods=["GET", "POST"])
    async def mixed() -> Response:
        return JSONResponse({"results": [
            "junk", {"url": "https://no-title.invalid"},
            {"title": "Kept", "content": None, "url": 7, "description": 5, "score": "high",
             "thumbnail": "bm90IGFuIGltYWdl"},  # base64 of "not an image": the hit stays, the thumbnail goes
        ]})

    @app.api_route("/slow/search", methods=["GET", "POST"])
    async def slow(request: Request) -> Response:
        async def client_gone() -> None:
            while not await request.is_disconnected():  # noqa: ASYNC110 (no event to wait on)
                await asyncio.sleep(0.02)

        # Stop as soon as the client gives up, so server shutdown does not wait for the sleep.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(client_gone(), SLOW_S)
        return JSONResponse({"results": []})

    return app


@pytest.fixture(scope="session")
def _app(demo_assets: DemoWorld) -> FastAPI:
    return make_app(LocalImageIndex(demo_assets.image_dir))


@pytest.fixture()
def searx_requests(_app: FastAPI) -> list[dict[str, str]]:
    """Query parameters of every request the fake SearxNG received, oldest first."""
    seen: list[dict[str, str]] = _app.state.seen
    return seen


@pytest.fixture(scope="session")
def live_server(_app: FastAPI) -> Iterator[str]:
    """Base URL of the server; backends are pointed at ``{live_server}/<variant>``."""
    app = _app
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))  # the OS picks a free port; no race with other test runs
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test HTTP server did not start")
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=5)
    sock.close()


@pytest.fixture()
def free_port_url() -> str:
    """A URL on a port nobody listens on (bound then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"

"""Shared fixtures: the tiny model (built once per session), the demo world, real servers.

``live_server`` runs the real app under a real uvicorn server on 127.0.0.1 in a background thread;
tests talk to it over HTTP with httpx. The loaded engine is shared between servers so that starting
one costs no model load.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The CLIs' error panels (typer + rich) wrap at the terminal's width, 80 without one: a message quoting a
# temporary path then breaks at a place that moves with the path's length, and a test looking for a phrase
# in it fails now and then. Wide enough that nothing wraps.
os.environ.setdefault("TERMINAL_WIDTH", "1000")
# The suite's servers keep no runs (today's behaviour, nothing written under ~/.cache); the run store's
# own tests (tests/store, tests/ui) name a store in a temporary folder.
os.environ.setdefault("SSR_RUN_STORE", "off")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """The tiny model's ops are too small to split: one intra-op thread is much faster on 2 cores."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ssr_server.engine.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def torch_engine(tiny_model_dir: Path) -> Iterator[Any]:
    import asyncio

    from ssr_server.engine.torch.engine import TorchEngine

    engine = TorchEngine(str(tiny_model_dir))
    yield engine
    asyncio.run(engine.close())


@pytest.fixture(scope="session")
def demo_tools() -> Any:
    from ssr_server.tools.registry import demo_registry

    return demo_registry()


@contextlib.contextmanager
def live_server(settings: Any = None, engine: Any = None, tools: Any = None,
                timeout_s: float = 60.0) -> Iterator[str]:
    """A real uvicorn server on 127.0.0.1 serving ``create_app(settings, engine, tools)``."""
    import uvicorn

    from ssr_server.api.app import create_app
    from ssr_server.api.connections import server_config
    from ssr_server.core.config import Settings

    port = free_port()
    settings = settings or Settings()
    # server_config: the same connection bounds as `ssr-server serve` (timeouts, connection cap)
    config = server_config(create_app(settings, engine=engine, tools=tools), settings, host="127.0.0.1",
                           port=port, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.started:
            break
        if not thread.is_alive():
            raise RuntimeError("server thread died during start-up")
        time.sleep(0.05)
    else:
        raise TimeoutError("server did not start")
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(15)


@pytest.fixture(scope="session")
def server_url(torch_engine: Any, demo_tools: Any) -> Iterator[str]:
    from ssr_server.core.config import Settings

    with live_server(Settings(max_concurrent_runs=8, max_queued_runs=32), torch_engine, demo_tools) as url:
        yield url


@pytest.fixture()
def client(server_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server_url, timeout=120) as c:
        yield c


SGLANG_TEST_DIRS = ("sglang", "router")  # the tests that start real SGLang servers


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """SSR_SGLANG_TESTS=0 skips the tests that start real SGLang servers (machines without its venv)."""
    if os.environ.get("SSR_SGLANG_TESTS", "1") != "0":
        return
    roots = [Path(__file__).parent / d for d in SGLANG_TEST_DIRS]
    for item in items:
        if any(root in Path(str(item.path)).parents for root in roots):
            item.add_marker(pytest.mark.skip(reason="SSR_SGLANG_TESTS=0"))


class GatedSearch:
    """A SearxNG stand-in on 127.0.0.1: the first ``free`` searches answer at once, later ones wait for
    ``open()`` (at most 60 s). For tests that need runs held in a tool call (drain, restart, cancel)."""

    def __init__(self, free: int = 0) -> None:
        self.gate, self.free, self.hits = threading.Event(), free, 0
        me = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                me.hits += 1
                if me.hits > me.free:
                    me.gate.wait(60)
                body = json.dumps({"results": [{"title": "A fact", "url": "http://example.invalid/",
                                                "content": "Something worth knowing."}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def open(self) -> None:
        self.gate.set()

    def close(self) -> None:
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="session")
def gated_search() -> type[GatedSearch]:
    """``GatedSearch`` for test modules (which cannot import a conftest)."""
    return GatedSearch

"""Fixtures of the hardening tests: servers that expose their uvicorn.Server, long runs, metrics.

Every server listens on 127.0.0.1 only and shares the session's tiny engine (no model load per server).
A *long* run is a freeform run with a demo image whose turns decode ``reasoning_budget`` tokens of
reasoning each (on 2 CPU cores: 1-2 s for a turn of 2048, the most a turn may have). How many turns a
run takes depends on the actions the (random) model decodes, so a test that needs a run to last uses one
long turn, and hangs up or acts as soon as it sees the run in flight. Where a run must last as long as
the test wants, it waits on a held search instead (``test_shutdown_process.py``).
"""

from __future__ import annotations

import base64
import contextlib
import io
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ssr_server.core.config import Settings


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LiveServer:
    url: str
    server: Any  # uvicorn.Server
    thread: threading.Thread

    def stop(self, join_s: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(join_s)


@pytest.fixture(scope="session")
def serve(torch_engine: Any, demo_tools: Any) -> Callable[..., contextlib.AbstractContextManager[LiveServer]]:
    """``with serve(Settings(...)) as live:`` a real uvicorn server in a thread, on 127.0.0.1."""

    @contextlib.contextmanager
    def _serve(settings: Settings | None = None, *, graceful_s: int = 15) -> Iterator[LiveServer]:
        import uvicorn

        from ssr_server.api.app import create_app
        from ssr_server.api.connections import server_config

        port = _free_port()
        settings = settings or Settings()
        app = create_app(settings, engine=torch_engine, tools=demo_tools)
        # The same protocol and bounds as `ssr-server serve` (header timeout, connection cap, ...).
        config = server_config(app, settings, host="127.0.0.1", port=port, log_level="warning", lifespan="on",
                               timeout_graceful_shutdown=graceful_s)
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, daemon=True, name=f"hardening-uvicorn-{port}")
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("server thread died during start-up")
            if time.monotonic() > deadline:
                raise TimeoutError("server did not start")
            time.sleep(0.02)
        live = LiveServer(f"http://127.0.0.1:{port}", server, thread)
        try:
            yield live
        finally:
            live.stop()
            assert not thread.is_alive(), "the server did not stop within 30 s"

    return _serve


@pytest.fixture(scope="session")
def demo_image_b64() -> str:
    from ssr_server.tools.demo import demo_picture, shipped_demo_world

    buf = io.BytesIO()
    demo_picture(shipped_demo_world().entity_ids()[0]).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="session")
def long_run(demo_image_b64: str) -> Callable[..., dict[str, Any]]:
    """The body of a long freeform run (see the module docstring)."""

    def _body(reasoning_budget: int = 100, max_turns: int = 6, **extra: Any) -> dict[str, Any]:
        return {"question": "What is the object in the image?", "images": [demo_image_b64],
                "mode": "freeform", "reasoning_budget": reasoning_budget, "max_turns": max_turns, **extra}

    return _body


def metric(text: str, sample: str, **labels: str) -> float:
    """Sum of the samples called ``sample`` whose labels include ``labels`` (0 when there is none)."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


@pytest.fixture(scope="session")
def read_metric() -> Callable[..., float]:
    """``read_metric(url, "ssr_runs_total", outcome="cancelled")``: one value from GET /metrics."""

    def _read(url: str, sample: str, headers: dict[str, str] | None = None, **labels: str) -> float:
        r = httpx.get(f"{url}/metrics", headers=headers, timeout=10)
        assert r.status_code == 200, r.text
        return metric(r.text, sample, **labels)

    return _read


def wait_until(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.05) -> bool:
    """Poll ``predicate`` until it holds or ``timeout_s`` passes; the last verdict."""
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)


@pytest.fixture(scope="session")
def poll() -> Callable[[Callable[[], bool], float], bool]:
    return wait_until


def engine_busy(engine: Any) -> int:
    """1 while the embedded engine's worker holds any job (queued, prefilling or generating), else 0."""
    return 0 if engine.scheduler.idle() else 1


@pytest.fixture(scope="session")
def engine_load(torch_engine: Any) -> Callable[[], int]:
    return lambda: engine_busy(torch_engine)

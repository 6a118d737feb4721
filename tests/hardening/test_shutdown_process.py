"""SIGTERM to a real ``ssr-server serve`` process, the way Kubernetes stops a pod.

From the signal on: ``/ready`` answers 503 (draining); the socket stays open and new runs are answered
503 ``shutting_down`` with Retry-After; runs in flight finish and are answered in full; runs still going
at the drain's deadline are cancelled and answered with a JSON 503 (a final ``error`` event on a
stream), queued ones too; the process is gone within the drain timeout + 5 s; a second signal exits at
once. Every wait is bounded and polls a condition; none sleeps and then asserts.

A run lasts as long as the test wants, whatever the engine's speed or the (random) model's choices: it
is an ssr run on a library whose every rationale leads to a text search, and the search backend (a
SearxNG stand-in on 127.0.0.1) holds each search until the test releases it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from ssr_server.api.shutdown import EXIT_MARGIN_S  # the process must be gone within drain + this

START_S = 180.0  # bound on start-up (imports and model load on a busy 2-core machine)
OUTCOMES = {"answered", "max_turns", "error", "timeout"}
SELECT = {"messages": [{"role": "user", "content": "What is this?"}]}


@dataclass
class Proc:
    url: str
    popen: subprocess.Popen[bytes]
    log: Path
    signalled_at: float = 0.0

    def sigterm(self) -> None:
        self.signalled_at = time.monotonic()
        self.popen.send_signal(signal.SIGTERM)

    def gone_within(self, bound_s: float) -> int:
        """Exit status, waiting at most until ``bound_s`` after the signal; fails if still alive."""
        left = max(0.0, self.signalled_at + bound_s - time.monotonic())
        try:
            return self.popen.wait(timeout=left)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the server was still alive {bound_s:g} s after SIGTERM\n{self.tail()}")

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


LIBRARY = """\
name: held-search
description: Every move is a text search (the tests' search backend holds each one).
candidates:
  - id: look_up
    text: I should look this up with a text search before I answer.
    action: text_search
"""


@pytest.fixture()
def search(gated_search: Any) -> Iterator[Any]:
    held = gated_search(free=0)  # every search waits for open()
    yield held
    held.close()


@pytest.fixture(scope="module")
def library_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("libraries")
    (d / "held-search.yaml").write_text(LIBRARY)
    return d


HELD = {"question": "Who built this?", "mode": "ssr", "library": "held-search", "max_turns": 4}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("serve-cache")  # the demo world is built here once, then reused


@pytest.fixture()
def start(tiny_model_dir: Path, cache_dir: Path, library_dir: Path, search: Any,
          tmp_path: Path) -> Iterator[Any]:
    procs: list[Proc] = []

    def _start(**settings: Any) -> Proc:
        port = free_port()
        env = {**os.environ, "SSR_CACHE_DIR": str(cache_dir), "SSR_TORCH_THREADS": "1",
               "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "SSR_SEARXNG_URL": search.url,
               "SSR_LIBRARY_DIRS": json.dumps([str(library_dir)]), "SSR_TOOL_TIMEOUT_S": "120",
               **{f"SSR_{k.upper()}": str(v) for k, v in settings.items()}}
        log = tmp_path / f"serve-{port}.log"
        cmd = [sys.executable, "-m", "ssr_server.cli", "serve", "--model", str(tiny_model_dir),
               "--host", "127.0.0.1", "--port", str(port), "--log-level", "info"]
        with log.open("wb") as out:
            popen = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        proc = Proc(f"http://127.0.0.1:{port}", popen, log)
        procs.append(proc)
        deadline = time.monotonic() + START_S
        while True:
            if popen.poll() is not None:
                pytest.fail(f"the server exited during start-up ({popen.returncode})\n{proc.tail()}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{proc.url}/ready", timeout=5).status_code == 200:
                    return proc
            if time.monotonic() > deadline:
                pytest.fail(f"the server did not become ready in {START_S:g} s\n{proc.tail()}")
            time.sleep(0.1)

    yield _start
    for proc in procs:  # a failed test must not leave a server behind
        if proc.popen.poll() is None:
            proc.popen.kill()
            proc.popen.wait(30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _poll(predicate: Any, timeout_s: float, what: str) -> None:
    try:
        async with asyncio.timeout(timeout_s):
            while True:  # each try is an HTTP round trip to another process: polled, bounded
                if await predicate():
                    return
                await asyncio.sleep(0.05)
    except TimeoutError:
        pytest.fail(f"not within {timeout_s:g} s: {what}")


async def _ready(client: httpx.AsyncClient) -> dict[str, Any]:
    r = await client.get("/ready")
    body: dict[str, Any] = r.json()
    body["status"] = r.status_code
    return body


def _events(text: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        lines = block.split("\n")
        name = next((ln[6:].strip() for ln in lines if ln.startswith("event:")), "message")
        data = "\n".join(ln[5:].lstrip() for ln in lines if ln.startswith("data:"))
        if data:
            out.append((name, json.loads(data)))
    return out


def _assert_shutting_down(r: httpx.Response) -> None:
    assert r.status_code == 503, (r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("application/json"), r.headers
    assert r.json()["error"]["code"] == "shutting_down", r.text
    retry = r.headers.get("retry-after", "")
    assert retry.isdigit() and int(retry) >= 1, r.headers


async def _held(client: httpx.AsyncClient, search: Any, running: int) -> None:
    """Wait until ``running`` runs are admitted and each has a search held by the backend."""

    async def ready() -> bool:
        return bool((await _ready(client))["runs_in_flight"] == running and search.hits >= running)

    await _poll(ready, 60, f"{running} runs in flight, each in a held search")


async def test_sigterm_finishes_runs_in_flight_and_answers_new_ones_503(start: Any,
                                                                      search: Any) -> None:
    drain_s = 60.0
    proc = start(drain_timeout_s=drain_s)
    async with httpx.AsyncClient(base_url=proc.url, timeout=120) as client:
        plain = asyncio.create_task(client.post("/v1/agent/runs", json=HELD))
        sse = asyncio.create_task(client.post("/v1/agent/runs", json={**HELD, "stream": True}))
        await _held(client, search, 2)
        proc.sigterm()

        async def draining() -> bool:
            return bool((await _ready(client))["status"] == 503)

        await _poll(draining, 5, "/ready says draining")  # the signal is handled on the next loop turn
        ready = await _ready(client)
        assert ready["draining"] is True and ready["ready"] is False and ready["runs_in_flight"] == 2, ready
        # the socket is still open: new work is answered, not refused at connect
        async with httpx.AsyncClient(base_url=proc.url, timeout=30) as fresh:
            _assert_shutting_down(await fresh.post("/v1/agent/runs", json=HELD))
            _assert_shutting_down(await fresh.post("/v1/agent/runs", json={**HELD, "stream": True}))
            _assert_shutting_down(await fresh.post("/v1/ssr/select", json=SELECT))
            assert (await fresh.get("/health")).status_code == 200  # alive, just not ready
        assert not plain.done() and not sse.done()

        search.open()  # the runs go on to their end
        r = await asyncio.wait_for(plain, 120)
        assert r.status_code == 200, r.text[:300]
        assert r.json()["outcome"] in OUTCOMES, r.json()["outcome"]
        r = await asyncio.wait_for(sse, 120)
        assert r.status_code == 200
        events = _events(r.text)
        assert events and events[-1][0] == "run", events[-1:]
        assert events[-1][1]["outcome"] in OUTCOMES
    assert proc.gone_within(drain_s + EXIT_MARGIN_S) == 0, proc.tail()


async def test_runs_past_the_drain_deadline_are_cancelled_and_answered_503(start: Any,
                                                                          search: Any) -> None:
    """Runs held in their searches against a 1 s drain: cut at the deadline, each answered with a
    JSON 503 (the stream with a final error event), the queued request too; then the process goes."""
    drain_s = 1.0
    proc = start(drain_timeout_s=drain_s, max_concurrent_runs=2, max_queued_runs=1)
    async with httpx.AsyncClient(base_url=proc.url, timeout=120) as client:
        plain = asyncio.create_task(client.post("/v1/agent/runs", json=HELD))
        sse = asyncio.create_task(client.post("/v1/agent/runs", json={**HELD, "stream": True}))
        await _held(client, search, 2)
        queued = asyncio.create_task(client.post("/v1/agent/runs", json=HELD))

        async def one_queued() -> bool:
            return bool((await _ready(client))["runs_queued"] == 1)

        await _poll(one_queued, 30, "one run queued")
        proc.sigterm()
        bound = drain_s + EXIT_MARGIN_S
        responses = await asyncio.wait_for(asyncio.gather(plain, sse, queued), bound + 5)
    _assert_shutting_down(responses[0])
    _assert_shutting_down(responses[2])
    stream = responses[1]
    assert stream.status_code == 200 and stream.headers["content-type"].startswith("text/event-stream")
    name, data = _events(stream.text)[-1]
    assert name == "error", (name, data)
    assert data["status"] == 503 and data["error"]["code"] == "shutting_down", data
    assert proc.gone_within(bound) == 0, proc.tail()
    assert "runs still in flight after the 1 s drain were cancelled" in proc.tail()


async def test_a_second_signal_exits_without_waiting_for_the_drain(start: Any, search: Any) -> None:
    proc = start(drain_timeout_s=600)
    async with httpx.AsyncClient(base_url=proc.url, timeout=120) as client:
        run = asyncio.create_task(client.post("/v1/agent/runs", json=HELD))
        await _held(client, search, 1)
        proc.sigterm()

        async def draining() -> bool:
            return bool((await _ready(client))["status"] == 503)

        await _poll(draining, 5, "/ready says draining")
        proc.popen.send_signal(signal.SIGTERM)
        proc.gone_within(30)  # 30 s, against a 600 s drain
        with contextlib.suppress(httpx.TransportError):
            await asyncio.wait_for(run, 30)

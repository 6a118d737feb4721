"""Clients that hang up mid-stream leave nothing behind: no task left pending (asyncio would log "Task was
destroyed but it is pending!" for each when it is collected), no run or slot counted, and the server
keeps serving. The outside attack saw that error logged on every disconnect of a stream."""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ssr_server.core.config import Settings

DISCONNECTS = 50


@pytest.fixture(scope="module")
def live(serve: Any) -> Iterator[Any]:
    with serve(Settings(max_concurrent_runs=4, max_queued_runs=64, run_deadline_s=60)) as live:
        yield live


def _pending_tasks() -> int:
    """Tasks not done, in the whole process (the server runs in a thread of this one)."""
    import asyncio
    import warnings

    with warnings.catch_warnings():  # isinstance on some of torch's objects warns of deprecations
        warnings.simplefilter("ignore")
        return sum(1 for o in gc.get_objects() if isinstance(o, asyncio.Task) and not o.done())


def _hang_up(client: httpx.Client, path: str, body: dict[str, Any], first_chunk: bool) -> None:
    """Start a stream and hang up: after its headers (the server is then relaying the run's events), or
    after its first chunk where one comes at once (the OpenAI stream's role delta)."""
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        if first_chunk:
            next(r.iter_raw())


def test_fifty_mid_stream_disconnects_leave_no_task_and_no_run(
        live: Any, long_run: Any, read_metric: Any, poll: Any, caplog: pytest.LogCaptureFixture) -> None:
    run = long_run(reasoning_budget=400, max_turns=2, stream=True)
    with httpx.Client(base_url=live.url, timeout=60) as client:
        model = client.get("/v1/models").json()["data"][0]["id"]
        chat = {"model": model, "messages": [{"role": "user", "content": "What is the object in the image?"}],
                "stream": True, "ssr": {"mode": "freeform", "reasoning_budget": 400}}
        _hang_up(client, "/v1/agent/runs", run, False)  # warm: the tasks a first request starts for good
        assert poll(lambda: httpx.get(f"{live.url}/ready", timeout=10).json()["runs_in_flight"] == 0, 30)
        gc.collect()
        before = _pending_tasks()
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            for i in range(DISCONNECTS):  # the REST agent stream and the OpenAI stream, in turn
                if i % 2:
                    _hang_up(client, "/v1/agent/runs", run, first_chunk=False)
                else:
                    _hang_up(client, "/v1/chat/completions", chat, first_chunk=True)

            def settled() -> bool:
                ready = httpx.get(f"{live.url}/ready", timeout=10).json()
                return (ready["runs_in_flight"] == 0 and ready["runs_queued"] == 0
                        and read_metric(live.url, "ssr_runs_in_flight") == 0)

            assert poll(settled, 60), "runs still counted after the clients left"
            gc.collect()
        destroyed = [r.getMessage() for r in caplog.records
                     if "destroyed but it is pending" in r.getMessage()]
        assert not destroyed, destroyed[:3]
        assert _pending_tasks() <= before + 2, (before, _pending_tasks())  # no growth with the disconnects
        r = client.post("/v1/agent/runs", json={"question": "What is this?", "max_turns": 1})
        assert r.status_code == 200, r.text

"""A client that goes away cancels its run: the run is recorded as cancelled, its admission slot and
its engine work are freed at once, and the server keeps serving."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from ssr_server.core.config import Settings

# A run longer than these tests wait before hanging up: a first turn of 2048 reasoning tokens (~1.5 s here);
# the server's deadline bounds the damage if cancellation ever fails.
LONG = {"reasoning_budget": 2048, "max_turns": 12}
DRAIN_S = 5.0  # how long the server may take to notice the disconnect and free everything


@pytest.fixture(scope="module")
def live(serve: Any) -> Iterator[Any]:
    with serve(Settings(max_concurrent_runs=1, max_queued_runs=1, run_deadline_s=30)) as live:
        yield live


@pytest.fixture()
def settled(live: Any, poll: Any, engine_load: Callable[[], int], read_metric: Any) -> Callable[[], bool]:
    """True once the server holds no run, no queued request and no engine work."""

    def _settled() -> bool:
        ready = httpx.get(f"{live.url}/ready", timeout=10).json()
        return (ready["runs_in_flight"] == 0 and ready["runs_queued"] == 0 and engine_load() == 0
                and read_metric(live.url, "ssr_runs_in_flight") == 0)

    assert poll(_settled, 30.0), "the server was busy before the test"
    return _settled


def _cancelled(read_metric: Any, url: str) -> float:
    return float(read_metric(url, "ssr_runs_total", mode="freeform", outcome="cancelled"))


async def _in_flight(client: httpx.AsyncClient, engine_load: Callable[[], int], timeout_s: float = 20,
                     ) -> None:
    async with asyncio.timeout(timeout_s):
        while True:
            ready = (await client.get("/ready")).json()
            if ready["runs_in_flight"] == 1 and engine_load() > 0:
                return
            await asyncio.sleep(0.02)


async def _assert_still_serving(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        r = await client.post("/v1/agent/runs", json={"question": "What is this?", "max_turns": 1})
        assert r.status_code == 200, r.text
        assert r.json()["outcome"] in {"answered", "max_turns", "error"}


async def test_client_timeout_cancels_the_run(live: Any, long_run: Any, read_metric: Any, poll: Any,
                                              settled: Callable[[], bool]) -> None:
    cancelled = _cancelled(read_metric, live.url)
    gone = read_metric(live.url, "ssr_requests_rejected_total", reason="client_disconnected")
    timeout = httpx.Timeout(0.3, connect=10)  # far shorter than the run (2048 tokens: >1 s anywhere)
    async with httpx.AsyncClient(base_url=live.url, timeout=timeout) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post("/v1/agent/runs", json=long_run(**LONG))
    assert await asyncio.to_thread(poll, settled, DRAIN_S), "the run was not cancelled"
    assert _cancelled(read_metric, live.url) == cancelled + 1
    assert read_metric(live.url, "ssr_requests_rejected_total", reason="client_disconnected") == gone + 1
    await _assert_still_serving(live.url)


async def test_client_gone_mid_run_cancels_engine_work(live: Any, long_run: Any, read_metric: Any, poll: Any,
                                                       engine_load: Callable[[], int],
                                                       settled: Callable[[], bool]) -> None:
    """Deterministic variant: the client leaves only once the run is seen in the engine."""
    cancelled = _cancelled(read_metric, live.url)
    async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
        request = asyncio.create_task(client.post("/v1/agent/runs", json=long_run(**LONG)))
        await _in_flight(client, engine_load)
        request.cancel()  # closes the connection mid-response
        with pytest.raises(asyncio.CancelledError):
            await request
    assert await asyncio.to_thread(poll, settled, DRAIN_S), "the run was not cancelled"
    assert _cancelled(read_metric, live.url) == cancelled + 1
    await _assert_still_serving(live.url)


async def test_sse_stream_dropped_mid_run_cancels_the_run(live: Any, long_run: Any, read_metric: Any,
                                                          poll: Any, engine_load: Callable[[], int],
                                                          settled: Callable[[], bool]) -> None:
    cancelled = _cancelled(read_metric, live.url)
    gone = read_metric(live.url, "ssr_requests_rejected_total", reason="client_disconnected")
    body = long_run(**LONG, stream=True)
    async with httpx.AsyncClient(base_url=live.url, timeout=60) as client, \
            client.stream("POST", "/v1/agent/runs", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        await _in_flight(client, engine_load)  # the run is in the engine: hang up mid-stream
    assert await asyncio.to_thread(poll, settled, DRAIN_S), "the streamed run was not cancelled"
    assert _cancelled(read_metric, live.url) == cancelled + 1
    # counted like a plain request whose client left
    assert read_metric(live.url, "ssr_requests_rejected_total", reason="client_disconnected") == gone + 1
    await _assert_still_serving(live.url)


async def test_client_gone_while_queued_frees_its_place(live: Any, long_run: Any, read_metric: Any, poll: Any,
                                                        engine_load: Callable[[], int],
                                                        settled: Callable[[], bool]) -> None:
    """max_concurrent_runs=1, max_queued_runs=1: a queued request whose client leaves must give its
    queue place back, not keep it (and later start a run nobody waits for)."""
    async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
        running = asyncio.create_task(client.post("/v1/agent/runs", json=long_run(**LONG)))
        await _in_flight(client, engine_load)
        queued = asyncio.create_task(client.post("/v1/agent/runs", json=long_run(**LONG)))
        async with asyncio.timeout(20):
            while True:
                if (await client.get("/ready")).json()["runs_queued"] == 1:
                    break
                await asyncio.sleep(0.02)
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued

        def place_freed() -> bool:
            return bool(httpx.get(f"{live.url}/ready", timeout=10).json()["runs_queued"] == 0)

        try:
            freed = await asyncio.to_thread(poll, place_freed, 2.0)
        finally:
            running.cancel()
            with pytest.raises(asyncio.CancelledError):
                await running
    assert await asyncio.to_thread(poll, settled, 2 * DRAIN_S + 1.0)
    assert freed, "a request whose client left still holds its place in the admission queue"
    await _assert_still_serving(live.url)

"""Graceful shutdown: stop admitting, finish what is in flight, then stop.

Three levels: ``Admission`` itself; the app's routes while it drains (in process, ASGI); and a real
uvicorn server told to exit the way SIGTERM tells it (``Server.handle_exit``) mid-run.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ssr_server.api.admission import Admission
from ssr_server.config import Settings
from ssr_server.errors import Overloaded, ShuttingDown

SELECT = {"messages": [{"role": "user", "content": "What is this?"}]}


async def _until(predicate: Any, timeout_s: float = 20.0) -> None:
    async with asyncio.timeout(timeout_s):
        while True:
            if predicate():
                return
            await asyncio.sleep(0.01)


# ---- Admission (unit) ------------------------------------------------------------------------------
async def test_admission_runs_queues_then_refuses() -> None:
    adm = Admission(max_running=2, max_queued=1)
    t1, t2 = await adm.acquire(), await adm.acquire()
    assert (adm.running, adm.queued) == (2, 0)
    waiter = asyncio.create_task(adm.acquire())
    await _until(lambda: adm.queued == 1)
    with pytest.raises(Overloaded) as exc:
        await adm.acquire()
    assert exc.value.retry_after_s >= 1.0 and exc.value.status_code == 429
    t1.release()
    t3 = await asyncio.wait_for(waiter, 5)
    assert (adm.running, adm.queued) == (2, 0)
    for t in (t2, t3):
        t.release()
    assert (adm.running, adm.queued) == (0, 0)
    assert await adm.drain(0.1)


async def test_admission_release_is_idempotent() -> None:
    adm = Admission(max_running=1, max_queued=0)
    ticket = await adm.acquire()
    ticket.release()
    ticket.release()  # e.g. a done-callback after an explicit release
    assert adm.running == 0
    again = await adm.acquire()
    with pytest.raises(Overloaded):  # a double release must not have minted a second slot
        await adm.acquire()
    again.release()


async def test_admission_cancelled_while_queued_gives_its_place_back() -> None:
    adm = Admission(max_running=1, max_queued=1)
    ticket = await adm.acquire()
    waiter = asyncio.create_task(adm.acquire())
    await _until(lambda: adm.queued == 1)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert adm.queued == 0
    ticket.release()
    assert (adm.running, adm.queued) == (0, 0)
    assert await adm.drain(0.1)
    # and the semaphore was not left short: a fresh Admission-sized load still fits
    adm.draining = False
    t = await asyncio.wait_for(adm.acquire(), 1)
    t.release()


async def test_admission_drain_waits_for_in_flight_and_refuses_new() -> None:
    adm = Admission(max_running=1, max_queued=2)
    running = await adm.acquire()
    queued = asyncio.create_task(adm.acquire())  # admitted before the drain: it will still run
    await _until(lambda: adm.queued == 1)
    assert not await adm.drain(0.05)  # timed out: something is still in flight
    assert adm.draining
    with pytest.raises(ShuttingDown) as exc:
        await adm.acquire()
    assert exc.value.status_code == 503 and exc.value.code == "shutting_down"
    drain = asyncio.create_task(adm.drain(10))
    running.release()
    second = await asyncio.wait_for(queued, 5)
    await asyncio.sleep(0.05)
    assert not drain.done()  # the queued run, admitted before the drain, is waited for too
    second.release()
    assert await asyncio.wait_for(drain, 5)
    assert (adm.running, adm.queued) == (0, 0)


async def test_admission_drain_when_idle_is_immediate() -> None:
    adm = Admission(max_running=1, max_queued=0)
    assert await asyncio.wait_for(adm.drain(0), 1)
    with pytest.raises(ShuttingDown):
        await adm.acquire()


# ---- the app while it drains (in process) ------------------------------------------------------------
async def test_app_drain_finishes_in_flight_refuses_new_and_is_not_ready(torch_engine: Any, demo_tools: Any,
                                                                        long_run: Any) -> None:
    from ssr_server.api.app import create_app

    app = create_app(Settings(drain_timeout_s=30), engine=torch_engine, tools=demo_tools)
    async with app.router.lifespan_context(app):
        adm: Admission = app.state.ssr.admission
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app", timeout=60) as client:
            r = await client.get("/ready")
            assert r.status_code == 200 and r.json()["draining"] is False, r.text
            run = asyncio.create_task(client.post("/v1/agent/runs", json=long_run(max_turns=4)))
            await _until(lambda: adm.running == 1)
            drain = asyncio.create_task(adm.drain(30))
            await _until(lambda: adm.draining)

            r = await client.get("/ready")
            assert r.status_code == 503, r.text
            body = r.json()
            assert body["ready"] is False and body["draining"] is True and body["runs_in_flight"] == 1
            assert (await client.get("/health")).status_code == 200  # alive, just not ready
            for path, payload in (("/v1/agent/runs", long_run(max_turns=1)), ("/v1/ssr/select", SELECT),
                                  ("/v1/agent/runs", long_run(max_turns=1, stream=True))):
                r = await client.post(path, json=payload)
                assert r.status_code == 503, (path, r.status_code, r.text[:300])
                assert r.json()["error"]["code"] == "shutting_down"
            assert not drain.done()

            r = await asyncio.wait_for(run, 60)
            assert r.status_code == 200, r.text
            assert r.json()["outcome"] == "max_turns" and len(r.json()["turns"]) == 4  # not cut
            assert await asyncio.wait_for(drain, 10)
            assert (adm.running, adm.queued) == (0, 0)


# ---- a real server told to exit mid-run ----------------------------------------------------------------
@pytest.fixture()
def sse_shutdown_flag() -> Iterator[None]:
    """sse-starlette remembers a SIGTERM in a process-wide flag; reset it so later servers stream."""
    from sse_starlette.sse import AppStatus

    yield
    AppStatus.should_exit = False


async def _refused(url: str) -> bool:
    """A new request is refused: no connection, or 503 shutting_down."""
    try:
        async with httpx.AsyncClient(base_url=url, timeout=5) as fresh:
            r = await fresh.post("/v1/agent/runs", json={"question": "x", "max_turns": 1})
    except httpx.TransportError:
        return True
    return r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"


def _sse_final(text: str) -> tuple[str | None, dict[str, Any] | None, int]:
    events: list[tuple[str, str]] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        lines = block.split("\n")
        name = next((ln[6:].strip() for ln in lines if ln.startswith("event:")), "message")
        data = "\n".join(ln[5:].lstrip() for ln in lines if ln.startswith("data:"))
        if data:
            events.append((name, data))
    turns = sum(1 for n, _ in events if n == "turn")
    if not events:
        return None, None, 0
    return events[-1][0], json.loads(events[-1][1]), turns


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "sse"])
async def test_sigterm_mid_run_drains_it(serve: Any, long_run: Any, stream: bool,
                                         sse_shutdown_flag: None) -> None:
    """SIGTERM (uvicorn's ``handle_exit``) while a run is in flight: the run is finished and answered
    in full, new requests are refused, and then the server stops."""
    max_turns = 4
    with serve(Settings(drain_timeout_s=20), graceful_s=20) as live:
        app = live.server.config.app
        async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
            run = asyncio.create_task(client.post("/v1/agent/runs",
                                                  json=long_run(reasoning_budget=60, max_turns=max_turns,
                                                               stream=stream)))
            await _until(lambda: app.state.ssr.admission.running == 1)
            live.server.handle_exit(signal.SIGTERM, None)  # what uvicorn's signal handler calls

            async with asyncio.timeout(10):
                while True:
                    if await _refused(live.url):
                        break
                    await asyncio.sleep(0.05)
            try:
                r = await asyncio.wait_for(run, 60)
            except httpx.TransportError as exc:
                pytest.fail(f"the in-flight run was cut at shutdown: {exc!r}")
            assert r.status_code == 200, r.text
            if stream:
                name, payload, turns = _sse_final(r.text)
                assert name == "run", f"the stream was cut at shutdown after {turns} turn events"
                assert payload is not None
                run_body = payload
            else:
                run_body = r.json()
            assert run_body["outcome"] == "max_turns" and len(run_body["turns"]) == max_turns  # not cut
        await asyncio.to_thread(live.thread.join, 30)
        assert not live.thread.is_alive(), "the server did not stop after draining"
        adm: Admission = app.state.ssr.admission
        assert adm.draining and (adm.running, adm.queued) == (0, 0)


def test_cli_bounds_uvicorn_graceful_shutdown(monkeypatch: pytest.MonkeyPatch) -> None:
    """`ssr-server serve` passes the drain timeout to uvicorn; a sub-second or zero timeout must not
    become 'wait forever' (None)."""
    import uvicorn

    from ssr_server import cli

    seen: list[Any] = []
    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: seen.append(kw.get("timeout_graceful_shutdown")))
    for value in ("30", "2.5", "0.5", "0"):
        monkeypatch.setenv("SSR_DRAIN_TIMEOUT_S", value)
        cli.serve(engine=None, model=None, host=None, port=None, dtype=None, sglang_url=None,
                  log_level="warning")
    wrong = {drain_s: got for drain_s, got in zip((30.0, 2.5, 0.5, 0.0), seen, strict=True)
             if got is None or not drain_s <= got <= drain_s + 1}
    assert not wrong, f"drain_timeout_s -> uvicorn timeout_graceful_shutdown (None = forever): {wrong}"

"""Graceful shutdown: stop admitting, finish what is in flight, cancel what outlives the drain, stop.

Three levels: ``Admission`` itself; the app's routes while it drains (in process, ASGI); and a real
``ssr-server serve`` process sent SIGTERM mid-run (``test_shutdown_process.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx
import pytest

from ssr_server.api.admission import Admission
from ssr_server.core.config import Settings
from ssr_server.core.errors import InvalidImage, Overloaded, ShuttingDown

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
    for _ in range(20):  # let the drain task run as far as it can (no clock involved)
        await asyncio.sleep(0)
    assert not drain.done()  # the queued run, admitted before the drain, is waited for too
    second.release()
    assert await asyncio.wait_for(drain, 5)
    assert (adm.running, adm.queued) == (0, 0)


async def test_admission_drain_when_idle_is_immediate() -> None:
    adm = Admission(max_running=1, max_queued=0)
    assert await asyncio.wait_for(adm.drain(0), 1)
    with pytest.raises(ShuttingDown):
        await adm.acquire()


async def test_expire_cancels_bound_work_and_queued_requests_as_shutting_down() -> None:
    """At the drain's deadline: a run task bound to its ticket is cancelled, a queued request and
    work under ``guard``/``slot`` end in ShuttingDown (a JSON 503), and every slot comes back."""
    adm = Admission(max_running=3, max_queued=1)
    forever = asyncio.Event()

    run_ticket = await adm.acquire()
    run = asyncio.create_task(forever.wait())
    run_ticket.bind(run)
    run.add_done_callback(run_ticket.release)

    async def intake() -> None:  # e.g. images being fetched under an admitted ticket
        ticket = await adm.acquire()
        await ticket.guard(forever.wait())

    async def step() -> None:  # e.g. one selection step holding a slot
        async with adm.slot():
            await forever.wait()

    guarded, stepping = asyncio.create_task(intake()), asyncio.create_task(step())
    await _until(lambda: adm.running == 3)
    queued = asyncio.create_task(adm.acquire())
    await _until(lambda: adm.queued == 1)
    assert not await adm.drain(0.05)

    assert adm.expire() == 4
    with pytest.raises(asyncio.CancelledError):
        await run  # the agent's own task: cancelled (the route answers ShuttingDown for it)
    for task in (guarded, stepping, queued):
        with pytest.raises(ShuttingDown):
            await asyncio.wait_for(task, 5)
    assert await adm.drain(5)
    assert (adm.running, adm.queued) == (0, 0)
    late = await asyncio.create_task(_admitted_then_bound(adm))
    assert late.cancelled()  # bound after the deadline: cancelled at once


async def _admitted_then_bound(adm: Admission) -> asyncio.Task[object]:
    adm.draining = False  # as if admitted just before the drain began
    ticket = await adm.acquire()
    task: asyncio.Task[object] = asyncio.create_task(asyncio.sleep(60))
    ticket.bind(task)
    task.add_done_callback(ticket.release)
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return task


async def test_a_failed_intake_frees_the_slot() -> None:
    adm = Admission(max_running=1, max_queued=0)
    ticket = await adm.acquire()

    async def bad_image() -> None:
        raise InvalidImage("not an image")

    with pytest.raises(InvalidImage):
        await ticket.guard(bad_image())
    assert adm.running == 0
    (await adm.acquire()).release()


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
            run = asyncio.create_task(client.post("/v1/agent/runs", json=long_run(2048, 1)))
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
            assert r.json()["outcome"] in {"answered", "max_turns"}, r.json()["outcome"]  # not cut
            assert await asyncio.wait_for(drain, 10)
            assert (adm.running, adm.queued) == (0, 0)

"""ssr-server on SGLang's router in front of two real SGLang CPU workers: a run's steps stay on the worker
that caches its prefix, a worker SIGKILLed under load costs no run a hang or a 500, and with no worker
left ``/ready`` says so and a run gets a clear JSON 503. The figures (cached share per policy, latency,
eval equality) are ``ssr-server bench router``'s; these tests check behaviour only."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from ssr_server.bench.router import RecordingSGLangEngine, demo_bodies, post_runs, router_settings
from ssr_server.bench.router_harness import RouterHarness
from ssr_server.bench.serve import live_server

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def served(stack: RouterHarness) -> Iterator[tuple[str, RecordingSGLangEngine]]:
    engine = RecordingSGLangEngine(stack.url, model=stack.model, scoring="generate")
    with live_server(router_settings(stack.url, stack.model), engine=engine) as url:
        yield url, engine


def _router_counter(stack: RouterHarness, name: str) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{stack.metrics_port}/metrics", timeout=5, trust_env=False).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line.rsplit(" ", 1)
            out[labels] = float(value)
    return out


def _runs_total(url: str, outcome: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5, trust_env=False).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("ssr_runs_total{") and f'outcome="{outcome}"' in line)


def test_runs_keep_their_prefix_on_one_worker(stack: RouterHarness,
                                              served: tuple[str, RecordingSGLangEngine]) -> None:
    url, engine = served
    results = asyncio.run(post_runs(url, demo_bodies(3, max_turns=2), 3))
    assert [r["status"] for r in results] == [200] * 3, results
    assert all(r["outcome"] in ("answered", "max_turns") for r in results), results
    # every request carried the conversation's routing key, and the router routed on it
    branches = _router_counter(stack, "smg_manual_policy_branch_total")
    assert not any("no_routing_id" in k and v for k, v in branches.items()), branches
    assert any("occupied_hit" in k and v for k, v in branches.items()), branches
    # so each selection's rows found the context its first step had just put in that worker's cache
    assert engine.rows and all(cached >= p - 1 for p, cached in engine.rows), engine.rows


def test_worker_sigkilled_under_load(stack: RouterHarness, served: tuple[str, RecordingSGLangEngine]) -> None:
    url, _ = served
    before = stack.requests_by_worker()

    async def scenario() -> list[dict[str, object]]:
        task = asyncio.create_task(post_runs(url, demo_bodies(8, max_turns=1), 8, timeout_s=150))
        async with httpx.AsyncClient(base_url=url, timeout=10, trust_env=False) as client:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not task.done():
                if (await client.get("/ready")).json()["runs_in_flight"] >= 8:
                    break
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        mid = await asyncio.to_thread(stack.requests_by_worker)
        victim = max(stack.workers, key=lambda p: mid[p] - before[p])
        await asyncio.to_thread(stack.kill_worker, victim)
        stack.workers.remove(victim)  # the module's teardown stops the other one only
        return await task

    results = asyncio.run(scenario())
    assert len(results) == 8
    for r in results:  # each run ends: an answer (a resent step), or a JSON 503; never a hang or a 500
        assert not r["hung"], results
        assert r["status"] == 200 or (r["status"] == 503 and r["json"]), results
    assert stack.wait_healthy(1, timeout_s=30) is not None, "the router kept the dead worker"
    survivor = stack.workers[0]
    b = stack.requests_by_worker()[survivor]
    after = asyncio.run(post_runs(url, demo_bodies(2, max_turns=1), 2))
    assert [r["status"] for r in after] == [200, 200], after
    assert stack.requests_by_worker()[survivor] > b


def test_no_worker_left(stack: RouterHarness, served: tuple[str, RecordingSGLangEngine]) -> None:
    url, _ = served
    errors = _runs_total(url, "error")
    for port in list(stack.workers):
        stack.kill_worker(port)
        stack.workers.remove(port)
    deadline = time.monotonic() + 30
    ready = httpx.get(url + "/ready", timeout=10, trust_env=False)
    while ready.status_code != 503 and time.monotonic() < deadline:
        time.sleep(0.2)
        ready = httpx.get(url + "/ready", timeout=10, trust_env=False)
    assert ready.status_code == 503 and ready.json()["ready"] is False
    [run] = asyncio.run(post_runs(url, demo_bodies(1, max_turns=1), 1, timeout_s=60))
    assert run["status"] == 503 and run["json"] and run["error"] == "engine_unavailable", run
    assert "no healthy worker" in str(run["message"])
    assert _runs_total(url, "error") == errors + 1

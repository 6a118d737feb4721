"""An async load generator for ``POST /v1/agent/runs``: open loop (Poisson arrivals) or closed loop.

* **Open loop** (``rate``): request *i* is due at the *i*-th arrival of a Poisson process of ``rate``
  per second and is launched on schedule whether or not earlier ones finished. A safety cap on
  in-flight requests (``max_in_flight``) keeps a stalled server from exhausting the client; a launch
  held back by the cap keeps its scheduled time, so ``sched_latency_s`` (due -> response) still shows
  the queueing a real open-loop client would see (no coordinated omission).
* **Closed loop** (``concurrency``): that many workers, each sending its next request as soon as its
  previous one returns.

Either way the load is bounded: nothing is launched after ``requests`` launches or ``duration_s``
seconds, whichever comes first, and requests still in flight then get ``timeout_s`` to finish before
they are cancelled. Every request sent ends as exactly one record: ``completed`` (HTTP 200),
``refused`` (429 or 503, with Retry-After noted) or ``failed`` (anything else, transport errors and
timeouts included). Targets must be loopback unless ``allow_remote=True``.

The pieces: ``workload`` (what is sent), ``client`` (one request), ``records`` (what happened), ``target``
(loopback only).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx

from ssr_server.loadtest.client import send_one
from ssr_server.loadtest.records import LoadResult, RequestRecord
from ssr_server.loadtest.target import check_target
from ssr_server.loadtest.workload import Workload

RUNS_PATH = "/v1/agent/runs"
DEFAULT_MAX_IN_FLIGHT = 256


def _stamp(rec: RequestRecord, origin: float) -> None:
    end = time.perf_counter() - origin
    rec.end_s = end
    rec.latency_s = end - rec.start_s
    rec.sched_latency_s = end - rec.scheduled_s


class _Progress:
    def __init__(self, total: int, enabled: bool) -> None:
        self.bar: Any = None
        self.counts = {"ok": 0, "failed": 0, "refused": 0}
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, unit="run", desc="load", dynamic_ncols=True)

    def done(self, rec: RequestRecord) -> None:
        key = {"completed": "ok", "failed": "failed", "refused": "refused"}[rec.fate]
        self.counts[key] += 1
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(self.counts, refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


async def run_load(
    target: str,
    *,
    rate: float | None = None,
    concurrency: int | None = None,
    requests: int = 100,
    duration_s: float = 60.0,
    modes: Mapping[str, float] | None = None,
    with_images: float = 1.0,
    max_turns: int = 4,
    timeout_s: float = 120.0,
    slo_s: float = 10.0,
    seed: int = 0,
    api_key: str | None = None,
    progress: bool = True,
    tau: float = 1.0,
    stream: bool = False,
    allow_remote: bool = False,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    extra_body: Mapping[str, Any] | None = None,
    on_record: Callable[[RequestRecord], Awaitable[None] | None] | None = None,
) -> LoadResult:
    """Send a bounded load to ``target`` (the server's base URL) and record every request's fate.

    Exactly one of ``rate`` (open loop, Poisson arrivals per second) and ``concurrency`` (closed loop)
    must be given. ``slo_s`` is only carried into the result's config for the report's goodput.
    """
    base = check_target(target, allow_remote)
    if (rate is None) == (concurrency is None):
        raise ValueError("give exactly one of rate (open loop) or concurrency (closed loop)")
    if rate is not None and not (math.isfinite(rate) and rate > 0):
        raise ValueError("rate must be a positive number of requests per second")
    if concurrency is not None and concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    if requests < 1 or duration_s <= 0 or timeout_s <= 0 or max_in_flight < 1:
        raise ValueError("requests, duration_s, timeout_s and max_in_flight must be positive")
    modes = dict(modes or {"ssr": 1.0})
    workload = Workload(modes, with_images, max_turns, seed, tau, extra_body)
    config = {"rate": rate, "concurrency": concurrency, "requests": requests, "duration_s": duration_s,
              "modes": modes, "with_images": with_images, "max_turns": max_turns, "timeout_s": timeout_s,
              "slo_s": slo_s, "seed": seed, "tau": tau, "stream": stream, "max_in_flight": max_in_flight}
    url = base + RUNS_PATH
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    cap = min(max_in_flight, concurrency) if concurrency is not None else max_in_flight
    limits = httpx.Limits(max_connections=cap, max_keepalive_connections=cap)
    # trust_env=False: never route loopback load through a proxy from the environment.
    timeout = httpx.Timeout(timeout_s, connect=min(10.0, timeout_s))
    records: list[RequestRecord] = []
    bar = _Progress(requests, progress)
    started_at = time.time()
    origin = time.perf_counter()
    launch_deadline = origin + duration_s
    last_launch = origin
    cap_waits = 0

    def settle(rec: RequestRecord) -> None:
        _stamp(rec, origin)
        records.append(rec)
        bar.done(rec)

    async with httpx.AsyncClient(headers=headers, timeout=timeout, limits=limits, trust_env=False) as client:

        async def fire(index: int, scheduled: float) -> None:
            req = workload.request(index)
            rec = RequestRecord(index=index, mode=req.mode, with_image=req.with_image,
                                question=req.question, fate="failed", scheduled_s=scheduled - origin,
                                start_s=time.perf_counter() - origin)
            try:
                await send_one(client, url, req, rec, stream)
            except asyncio.CancelledError:
                rec.fate, rec.error = "failed", "cancelled: still in flight when the load ended"
                settle(rec)  # every request sent ends as exactly one record
                raise
            settle(rec)
            if on_record is not None:
                maybe = on_record(rec)
                if maybe is not None:
                    await maybe

        tasks: set[asyncio.Task[None]] = set()
        try:
            if rate is not None:
                sem = asyncio.Semaphore(cap)
                rng = random.Random(seed ^ 0x5EED)
                due = origin
                for index in range(requests):
                    due += rng.expovariate(rate)
                    if due >= launch_deadline:
                        break
                    delay = due - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    if sem.locked():
                        cap_waits += 1
                    await sem.acquire()
                    if time.perf_counter() >= launch_deadline:
                        sem.release()
                        break
                    last_launch = time.perf_counter()
                    task = asyncio.create_task(fire(index, due))
                    task.add_done_callback(lambda _t: sem.release())
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
            else:
                assert concurrency is not None
                counter = iter(range(requests))

                async def worker() -> None:
                    nonlocal last_launch
                    for index in counter:
                        now = time.perf_counter()
                        if now >= launch_deadline:
                            return
                        last_launch = now
                        await fire(index, now)

                for _ in range(concurrency):
                    task = asyncio.create_task(worker())
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                # workers launch until the deadline; after it, what is in flight gets timeout_s
                await asyncio.wait(set(tasks), timeout=max(0.0, launch_deadline - time.perf_counter()))
            cancelled = await _drain(tasks, timeout_s)
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            bar.close()
            raise
    bar.close()
    records.sort(key=lambda r: r.index)
    return LoadResult(target=base, loop="open" if rate is not None else "closed", config=config,
                      records=records, started_at=started_at, elapsed_s=time.perf_counter() - origin,
                      launch_window_s=last_launch - origin, cap_waits=cap_waits, cancelled_at_end=cancelled)


async def _drain(tasks: set[asyncio.Task[None]], timeout_s: float) -> int:
    """Wait up to ``timeout_s`` for what is in flight; cancel the rest. Returns how many were cancelled."""
    pending = set(tasks)
    if not pending:
        return 0
    _, still = await asyncio.wait(pending, timeout=timeout_s)
    for t in still:
        t.cancel()
    await asyncio.gather(*still, return_exceptions=True)
    return len(still)


def run_load_sync(target: str, **kwargs: Any) -> LoadResult:
    """``run_load`` from synchronous code (the CLI): its own event loop."""
    return asyncio.run(run_load(target, **kwargs))


__all__ = ["DEFAULT_MAX_IN_FLIGHT", "RUNS_PATH", "run_load", "run_load_sync"]

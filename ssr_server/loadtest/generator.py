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

Questions and pictures come from the offline demo world, so the same seed sends the same bytes.
"""

from __future__ import annotations

import asyncio
import base64
import io
import ipaddress
import json
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx

Fate = Literal["completed", "failed", "refused"]
REFUSED_STATUSES = frozenset({429, 503})
RUNS_PATH = "/v1/agent/runs"
DEFAULT_MAX_IN_FLIGHT = 256


class RemoteTargetError(ValueError):
    """The target is not a loopback address and ``allow_remote`` was not given."""


@dataclass
class RequestRecord:
    """What happened to one request. Times are seconds relative to the start of the load."""

    index: int
    mode: str
    with_image: bool
    question: str
    fate: Fate
    status: int | None = None  # HTTP status; None when no response came (transport error, timeout)
    outcome: str | None = None  # the run's outcome when completed
    scheduled_s: float = 0.0  # when it was due (open loop) or taken (closed loop)
    start_s: float = 0.0  # when it was sent
    end_s: float = 0.0  # when its response (or its error) arrived
    latency_s: float = 0.0  # end - start: what the server took, as the client saw it
    sched_latency_s: float = 0.0  # end - scheduled: includes any wait for the in-flight cap
    first_turn_s: float | None = None  # streaming only: start -> first ``turn`` event
    turns: int = 0
    reasoning_s: list[float] = field(default_factory=list)  # per turn, as the server measured it
    model_s: float | None = None
    tool_s: float | None = None
    server_total_s: float | None = None
    retry_after_s: float | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LoadResult:
    target: str
    loop: Literal["open", "closed"]
    config: dict[str, Any]
    records: list[RequestRecord]
    started_at: float  # wall clock (time.time()) at the start
    elapsed_s: float  # start -> last request settled
    launch_window_s: float  # start -> last launch
    cap_waits: int = 0  # open loop: launches held back by the in-flight cap
    cancelled_at_end: int = 0  # still in flight after the final wait, cancelled (counted as failed)

    @property
    def sent(self) -> int:
        return len(self.records)

    def count(self, fate: Fate) -> int:
        return sum(1 for r in self.records if r.fate == fate)

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "loop": self.loop, "config": self.config,
                "started_at": self.started_at, "elapsed_s": self.elapsed_s,
                "launch_window_s": self.launch_window_s, "cap_waits": self.cap_waits,
                "cancelled_at_end": self.cancelled_at_end, "records": [r.to_dict() for r in self.records]}


# ---- target checks --------------------------------------------------------------------------------
def is_loopback(target: str) -> bool:
    """True for http(s) URLs on 127.0.0.0/8, ::1 or ``localhost`` (names are not resolved)."""
    try:
        parts = urlsplit(target)
        host = parts.hostname
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not host:
        return False
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_target(target: str, allow_remote: bool = False) -> str:
    """The target without a trailing slash; refuses non-loopback hosts unless ``allow_remote``."""
    parts = urlsplit(target)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"target must be an http(s) URL, got {target!r}")
    if not allow_remote and not is_loopback(target):
        raise RemoteTargetError(
            f"refusing to load {parts.hostname!r}: only loopback targets (127.0.0.0/8, ::1, localhost) "
            "unless allow_remote=True")
    return target.rstrip("/")


# ---- the workload -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlannedRequest:
    index: int
    mode: str
    question: str
    entity_id: str
    with_image: bool
    body: dict[str, Any]


def _normalise_modes(modes: Mapping[str, float]) -> tuple[list[str], list[float]]:
    names = [m for m, w in modes.items() if w > 0]
    weights = [float(modes[m]) for m in names]
    if not names or not all(math.isfinite(w) for w in weights):
        raise ValueError(f"modes must give at least one mode a positive finite weight, got {dict(modes)}")
    unknown = [m for m in names if m not in ("ssr", "freeform")]
    if unknown:
        raise ValueError(f"unknown mode(s) {unknown}; the server knows 'ssr' and 'freeform'")
    return names, weights


_IMAGE_CACHE: dict[str, str] = {}


def demo_image_b64(entity_id: str) -> str:
    """The demo world's picture of ``entity_id`` as base64 PNG (encoded once per process)."""
    hit = _IMAGE_CACHE.get(entity_id)
    if hit is None:
        from ssr_server.world import demo_picture

        buf = io.BytesIO()
        demo_picture(entity_id).save(buf, format="PNG")
        hit = _IMAGE_CACHE[entity_id] = base64.b64encode(buf.getvalue()).decode("ascii")
    return hit


def _demo_questions() -> list[tuple[str, str]]:
    """(question, entity id) of the demo world's questions about a picture (built once, ~1 s)."""
    import tempfile

    from ssr_server.world import demo_questions, demo_world

    with tempfile.TemporaryDirectory(prefix="ssr-loadtest-") as tmp:
        questions = demo_questions(demo_world(tmp))
    return [(q.question, q.entity_id) for q in questions if q.kind != "named"]


class Workload:
    """Request ``i`` of a seed is always the same mode, question, image and sampling seed."""

    def __init__(self, modes: Mapping[str, float], with_images: float, max_turns: int, seed: int,
                 tau: float = 1.0, extra: Mapping[str, Any] | None = None) -> None:
        if not 0.0 <= with_images <= 1.0:
            raise ValueError("with_images must lie in [0, 1]")
        self.mode_names, self.mode_weights = _normalise_modes(modes)
        self.with_images, self.max_turns, self.seed, self.tau = with_images, max_turns, seed, tau
        self.extra = dict(extra or {})
        self.questions = _demo_questions()

    def request(self, index: int) -> PlannedRequest:
        rng = random.Random(self.seed * 1_000_003 + index)
        mode = rng.choices(self.mode_names, self.mode_weights)[0]
        question, entity = rng.choice(self.questions)
        with_image = rng.random() < self.with_images
        body: dict[str, Any] = {"question": question, "mode": mode, "max_turns": self.max_turns,
                                "tau": self.tau, "seed": rng.randrange(2**31)}
        if with_image:
            body["images"] = [demo_image_b64(entity)]
        body.update(self.extra)
        return PlannedRequest(index, mode, question, entity, with_image, body)


# ---- one request ------------------------------------------------------------------------------------
def _retry_after(headers: httpx.Headers) -> float | None:
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None  # an HTTP date: not worth parsing here


def _fill_from_run(rec: RequestRecord, run: Mapping[str, Any]) -> None:
    rec.outcome = run.get("outcome")
    turns = run.get("turns") or []
    rec.turns = len(turns)
    rec.reasoning_s = [float(t.get("reasoning_s", 0.0)) for t in turns]
    timings = run.get("timings") or {}
    rec.model_s = timings.get("model_s")
    rec.tool_s = timings.get("tool_s")
    rec.server_total_s = timings.get("total_s")


def _error_text(resp_text: str, status: int) -> str:
    try:
        err = json.loads(resp_text).get("error", {})
        return f"{status} {err.get('code', '')}: {err.get('message', '')}".strip()
    except (ValueError, AttributeError):
        return f"{status}: {resp_text[:200]}"


async def _send_plain(client: httpx.AsyncClient, url: str, req: PlannedRequest, rec: RequestRecord) -> None:
    resp = await client.post(url, json=req.body)
    rec.status = resp.status_code
    if resp.status_code == 200:
        _fill_from_run(rec, resp.json())
        rec.fate = "completed"
    else:
        _classify_error(rec, resp.status_code, resp.headers, resp.text)


def _classify_error(rec: RequestRecord, status: int, headers: httpx.Headers, text: str) -> None:
    rec.error = _error_text(text, status)
    if status in REFUSED_STATUSES:
        rec.fate = "refused"
        rec.retry_after_s = _retry_after(headers)
    else:
        rec.fate = "failed"


async def _send_stream(client: httpx.AsyncClient, url: str, req: PlannedRequest, rec: RequestRecord,
                       t0: float) -> None:
    body = dict(req.body, stream=True)
    async with client.stream("POST", url, json=body) as resp:
        rec.status = resp.status_code
        if resp.status_code != 200:
            text = (await resp.aread()).decode("utf-8", "replace")
            _classify_error(rec, resp.status_code, resp.headers, text)
            return
        event, data = "message", []
        async for line in resp.aiter_lines():
            if line.startswith(":"):
                continue  # keep-alive comment
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip())
            elif line == "" and data:
                payload = "\n".join(data)
                if event == "turn" and rec.first_turn_s is None:
                    rec.first_turn_s = time.perf_counter() - t0
                elif event == "run":
                    _fill_from_run(rec, json.loads(payload))
                    rec.fate = "completed"
                elif event == "error":
                    err = json.loads(payload)
                    status = int(err.get("status", 500))
                    rec.status = status
                    rec.error = _error_text(json.dumps({"error": err.get("error", {})}), status)
                    rec.fate = "refused" if status in REFUSED_STATUSES else "failed"
                event, data = "message", []
        if rec.fate != "completed" and rec.error is None:
            rec.fate, rec.error = "failed", "stream ended without a run event"


async def _one(client: httpx.AsyncClient, url: str, req: PlannedRequest, rec: RequestRecord,
               stream: bool) -> None:
    """Send one request and fill ``rec`` in; never raises but ``CancelledError``."""
    t0 = time.perf_counter()
    try:
        if stream:
            await _send_stream(client, url, req, rec, t0)
        else:
            await _send_plain(client, url, req, rec)
    except httpx.TimeoutException as exc:
        rec.fate, rec.error = "failed", f"timeout: {type(exc).__name__}"
    except httpx.HTTPError as exc:
        rec.fate, rec.error = "failed", f"transport: {type(exc).__name__}: {exc}"
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        rec.fate, rec.error = "failed", f"bad response: {type(exc).__name__}: {exc}"


def _stamp(rec: RequestRecord, origin: float) -> None:
    end = time.perf_counter() - origin
    rec.end_s = end
    rec.latency_s = end - rec.start_s
    rec.sched_latency_s = end - rec.scheduled_s


# ---- the driver -------------------------------------------------------------------------------------
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
                await _one(client, url, req, rec, stream)
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


__all__ = ["LoadResult", "RemoteTargetError", "RequestRecord", "Workload", "check_target",
           "demo_image_b64", "is_loopback", "run_load", "run_load_sync"]

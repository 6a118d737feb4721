"""Admission before the body, measured: ``ssr-server bench overload --admission``.

A server with one slot and no queue (SSR_MAX_CONCURRENT_RUNS=1, SSR_MAX_QUEUED_RUNS=0) is sent a burst
of oversized requests (four 16 MP PNGs each) at once, by two kinds of client, against a full server
(one such run in flight) and an idle one. Each case runs on a fresh ``ssr-server serve``. The bodies'
own upload time is measured side by side: the same burst sent to a sink (stock uvicorn, an app that
reads each body whole, then answers), since on loopback the kernel takes a 300 KB body at once and a
client cannot tell when the server has it.

Linux only (reads /proc). Bounded: every request and the whole run have timeouts, and every server is
stopped whatever happens.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
from starlette.types import Receive, Scope, Send

from ssr_server.bench.overload import free_port, png_variants, server_process, status_kb
from ssr_server.bench.raw_http import RawResponse, read_response, request_head
from ssr_server.bench.report import write_json
from ssr_server.core.summary import percentiles

FLOOR_EXPECT_P95_S = 0.2  # Expect: 100-continue: p95 of the 429s
FLOOR_AFTER_UPLOAD_S = 0.1  # no Expect: every 429 within the body's own upload time + this
FLOOR_BEYOND_MB = 100.0  # peak RSS growth beyond what the admitted runs themselves take
EXPECT_WAIT_S = 1.0  # how long the Expect client waits for 100 Continue before it sends anyway (curl's)
CLIENTS = ("plain", "expect")


async def sink_app(scope: Scope, receive: Receive, send: Send) -> None:
    """The upload reference: reads the whole body, then answers 204."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message["type"] == "http.request" and bool(message.get("more_body"))
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


@contextlib.contextmanager
def _sink(start_timeout_s: float = 60.0) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "uvicorn", "ssr_server.bench.admission:sink_app", "--host", "127.0.0.1",
           "--port", str(port), "--log-level", "warning", "--lifespan", "off"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the upload sink did not start")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@dataclass
class Answer:
    status: int  # 0: no answer (a connection error or the timeout)
    total_s: float  # from the first byte sent to the answer
    sent_body: bool


async def _plain(host: str, port: int, path: str, body: bytes, start: asyncio.Event,
                 timeout_s: float) -> Answer:
    """A raw client without Expect that does what h11 (httpx) does: writes the whole body, then reads the
    answer. Raw rather than httpx itself: 400 requests through one httpx client cost the client 5-10 s of
    its own CPU between a body's last byte and reading its answer (httpcore's pool bookkeeping is
    O(n^2)), and one client each still put 0.15 s of the client's scheduling into every figure."""
    reader, writer = await asyncio.open_connection(host, port)
    await start.wait()
    t0 = time.perf_counter()
    sent = False
    try:
        async with asyncio.timeout(timeout_s):
            writer.write(request_head(path, len(body)) + body)
            await writer.drain()
            sent = True
            status = (await read_response(reader)).status
    except (OSError, ConnectionError, asyncio.IncompleteReadError, TimeoutError, ValueError):
        status = 0
    t1 = time.perf_counter()
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return Answer(status, t1 - t0, sent)


async def _expect(host: str, port: int, path: str, body: bytes, start: asyncio.Event,
                  timeout_s: float) -> Answer:
    """A raw client that sends ``Expect: 100-continue`` and behaves as curl does: the body follows a
    100 Continue (or 1 s of silence); a final answer first means no body, and the connection closed."""
    reader, writer = await asyncio.open_connection(host, port)
    await start.wait()
    t0 = time.perf_counter()
    sent = False
    try:
        async with asyncio.timeout(timeout_s):
            writer.write(request_head(path, len(body), expect=True))
            await writer.drain()
            try:
                async with asyncio.timeout(EXPECT_WAIT_S):
                    first: RawResponse | None = await read_response(reader)
            except TimeoutError:
                first = None
            if first is None or first.status == 100:
                writer.write(body)
                await writer.drain()
                sent = True
                first = await read_response(reader)
            status = first.status
    except (OSError, ConnectionError, asyncio.IncompleteReadError, TimeoutError, ValueError):
        status = 0
    t1 = time.perf_counter()
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return Answer(status, t1 - t0, sent)


async def _burst(url: str, kind: str, body: bytes, n: int, timeout_s: float) -> list[Answer]:
    """``n`` requests at the same moment, each on its own connection (all connected first)."""
    host, port = url.removeprefix("http://").split(":")
    start = asyncio.Event()
    client = _plain if kind == "plain" else _expect
    tasks = [asyncio.create_task(client(host, int(port), "/v1/agent/runs", body, start, timeout_s))
             for _ in range(n)]
    await asyncio.sleep(0.5)
    start.set()
    return list(await asyncio.wait_for(asyncio.gather(*tasks), timeout_s + 30))


async def _run_alone(url: str, body: bytes, timeout_s: float) -> int:
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s) as client:
        r = await client.post("/v1/agent/runs", content=body, headers={"content-type": "application/json"})
        return r.status_code


def _reset_peak(pid: int) -> float:
    """Reset the kernel's high-water mark of ``pid`` to its current RSS (Linux 4.0+); that RSS in MB."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return status_kb(pid, "VmRSS") / 1024


@dataclass
class AdmissionCase:
    client: str  # plain (no Expect) | expect (Expect: 100-continue)
    burst: int
    state: str  # full (its one slot held by an admitted request) | idle
    statuses: dict[str, int]
    admitted: int  # the burst's 200s, plus the run that filled the server
    bodies_sent: int  # how many of the burst's clients sent their body
    refused_p50_s: float  # the 429s, from the request's first byte
    refused_p95_s: float
    refused_max_s: float
    upload_p95_s: float  # plain: the same burst's bodies, read whole by the sink (its answer)
    upload_max_s: float
    growth_mb: float  # peak RSS - RSS before the case
    beyond_mb: float  # growth - what the admitted runs take alone
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.notes


@dataclass
class AdmissionResult:
    body_bytes: int
    images_per_request: int
    image_pixels: int
    alone_growth_mb: float  # one such run alone on a fresh server
    alone_s: float  # and how long it took
    cases: list[AdmissionCase]
    wall_s: float

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.cases)


def _admission_case(kind: str, n: int, state: str, body: bytes, env: dict[str, str], model: str | None,
                    alone_mb: float, uploads: list[float], timeout_s: float) -> AdmissionCase:
    with server_process(env, model, start_timeout_s=300.0) as (url, pid):
        before = _reset_peak(pid)

        async def go() -> tuple[list[Answer], int | None]:
            if state != "full":
                return await _burst(url, kind, body, n, timeout_s), None
            # The server is filled by a request admitted from its headers (Expect: 100-continue) whose
            # body follows once the burst has its answers: full however long a run takes here.
            host, port = url.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            try:
                writer.write(request_head("/v1/agent/runs", len(body), expect=True))
                if (interim := await asyncio.wait_for(read_response(reader), 60)).status != 100:
                    raise RuntimeError(f"the request meant to fill the server got {interim.status}")
                answers = await _burst(url, kind, body, n, timeout_s)
                writer.write(body)
                return answers, (await asyncio.wait_for(read_response(reader), timeout_s)).status
            finally:
                writer.close()

        answers, blocker_status = asyncio.run(go())
        peak = status_kb(pid, "VmHWM") / 1024
    statuses = Counter(str(a.status) for a in answers)
    times = [a.total_s for a in answers if a.status == 429]
    admitted = statuses.get("200", 0) + (1 if blocker_status == 200 else 0)
    growth = peak - before
    plain = kind == "plain"
    refused, upload = percentiles(times, (50, 95)), percentiles(uploads if plain else [], (95,))
    case = AdmissionCase(
        client=kind, burst=n, state=state, statuses=dict(sorted(statuses.items())), admitted=admitted,
        bodies_sent=sum(a.sent_body for a in answers), refused_p50_s=refused["p50"] or 0.0,
        refused_p95_s=refused["p95"] or 0.0, refused_max_s=refused["max"] or 0.0,
        upload_p95_s=upload["p95"] or 0.0, upload_max_s=upload["max"] or 0.0,
        growth_mb=growth, beyond_mb=growth - admitted * alone_mb)
    want = {"full": {"429": n}, "idle": {"200": 1, "429": n - 1}}[state]
    if case.statuses != want:
        case.notes.append(f"answers {case.statuses}, expected {want}")
    if state == "full" and blocker_status != 200:
        case.notes.append(f"the request that filled the server got {blocker_status}")
    if not plain and case.bodies_sent != want.get("200", 0):
        case.notes.append(f"{case.bodies_sent} bodies sent, expected {want.get('200', 0)}")
    if not plain and case.refused_p95_s > FLOOR_EXPECT_P95_S:
        case.notes.append(f"429 p95 {case.refused_p95_s:.3f} s > {FLOOR_EXPECT_P95_S} s")
    if plain and case.refused_max_s > case.upload_max_s + FLOOR_AFTER_UPLOAD_S:
        case.notes.append(f"the last 429 came at {case.refused_max_s:.3f} s, the last upload ended at "
                          f"{case.upload_max_s:.3f} s (+ {FLOOR_AFTER_UPLOAD_S} s allowed)")
    if case.beyond_mb >= FLOOR_BEYOND_MB:
        case.notes.append(f"RSS grew {case.beyond_mb:.0f} MB beyond the admitted runs "
                          f"(>= {FLOOR_BEYOND_MB:.0f})")
    return case


def run_admission_bench(*, bursts: tuple[int, ...] = (40, 400), clients: tuple[str, ...] = CLIENTS,
                        states: tuple[str, ...] = ("full", "idle"), images: int = 4, width: int = 4000,
                        height: int = 4000, reasoning_budget: int = 1024, max_turns: int = 2,
                        model: str | None = None, timeout_s: float = 300.0,
                        json_path: str | None = None) -> AdmissionResult:
    """Admission before the body, side by side: every (burst, client, state) case on its own fresh server
    with one slot and no queue, after one run alone (what an admitted run takes: the RSS baseline) and,
    per burst, the bodies' upload time to the sink. Every request is the same freeform run with
    ``images`` distinct PNGs, long enough (``reasoning_budget`` tokens a turn) to hold its slot while a
    burst is answered."""
    t0 = time.perf_counter()
    pngs = png_variants(width, height, images)
    body = json.dumps({"question": "What is in these pictures?", "mode": "freeform", "max_turns": max_turns,
                       "reasoning_budget": reasoning_budget,
                       "images": [base64.b64encode(p).decode() for p in pngs]}).encode()
    env = {"SSR_MAX_CONCURRENT_RUNS": "1", "SSR_MAX_QUEUED_RUNS": "0", "SSR_RUN_DEADLINE_S": str(timeout_s),
           "SSR_DRAIN_TIMEOUT_S": "5", "HF_HUB_OFFLINE": "1"}
    with server_process(env, model, start_timeout_s=300.0) as (url, pid):
        before = _reset_peak(pid)
        t_alone = time.perf_counter()
        status = asyncio.run(_run_alone(url, body, timeout_s))
        alone_s = time.perf_counter() - t_alone
        alone = status_kb(pid, "VmHWM") / 1024 - before
    if status != 200:
        raise RuntimeError(f"one run alone was answered {status}")
    uploads: dict[int, list[float]] = {}
    if "plain" in clients:
        with _sink() as sink:
            for n in bursts:
                answers = asyncio.run(_burst(sink, "plain", body, n, timeout_s))
                if any(a.status != 204 for a in answers):
                    raise RuntimeError(f"the upload sink answered {Counter(a.status for a in answers)}")
                uploads[n] = [a.total_s for a in answers]
    cases = [_admission_case(kind, n, state, body, env, model, alone, uploads.get(n, []), timeout_s)
             for n in bursts for kind in clients for state in states]
    result = AdmissionResult(len(body), images, width * height, alone, alone_s, cases,
                             time.perf_counter() - t0)
    if json_path:
        write_json(json_path, {**asdict(result), "passed": result.passed})
    return result


def format_admission(r: AdmissionResult) -> str:
    lines = [
        f"one slot, no queue; each request {r.images_per_request} x {r.image_pixels / 1e6:.3g} MP PNG, a "
        f"{r.body_bytes / 1024:.0f} KB body; one run alone: {r.alone_s:.1f} s, server RSS +"
        f"{r.alone_growth_mb:.0f} MB",
        "clients: raw asyncio sockets, one connection each, all connected before the burst; plain: no "
        "Expect, writes the whole body, then reads (as h11/httpx do); expect: Expect: 100-continue, as "
        "curl does (the body only after 100 Continue or 1 s; a final answer first: no body, close)",
        "upload: the same burst to a sink that reads every body whole before answering (stock uvicorn)",
        f"{'client':<7}{'burst':>6} {'server':<6} {'answers':<19}{'bodies':>7} {'429 p50/p95/max s':>19} "
        f"{'upload p95/max s':>17} {'RSS +MB':>8} {'beyond':>7}  verdict",
    ]
    for c in r.cases:
        upload = f"{c.upload_p95_s:.3f}/{c.upload_max_s:.3f}" if c.client == "plain" else "-"
        answers = ", ".join(f"{v} x {k}" for k, v in c.statuses.items())
        lines.append(
            f"{c.client:<7}{c.burst:>6} {c.state:<6} {answers:<19}{c.bodies_sent:>7} "
            f"{c.refused_p50_s:>7.3f}/{c.refused_p95_s:.3f}/{c.refused_max_s:.3f} {upload:>17} "
            f"{round(c.growth_mb):>8d} {round(c.beyond_mb):>7d}  {'PASS' if c.passed else 'FAIL'}")
        lines += [f"    note: {n}" for n in c.notes]
    lines.append(f"floors: expect: 429 p95 <= {FLOOR_EXPECT_P95_S} s; plain: the last 429 <= the last "
                 f"upload + {FLOOR_AFTER_UPLOAD_S} s; RSS beyond the admitted runs < {FLOOR_BEYOND_MB:.0f} "
                 f"MB; full: every request refused; idle: exactly one admitted. Wall {r.wall_s:.0f} s: "
                 f"{'PASS' if r.passed else 'FAIL'}")
    return "\n".join(lines)

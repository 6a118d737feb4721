"""Overload benchmark: peak memory of a real ``ssr-server serve`` hit by 4x its capacity at once.

Capacity is what the server holds at once: ``max_concurrent_runs`` running plus ``max_queued_runs``
waiting; beyond that it answers 429. The bench starts the server as a subprocess on 127.0.0.1, sends
``factor x capacity`` requests at the same moment, each with ``images`` distinct 16 MP PNGs (valid,
well-compressed: ~60 KB each, far under the byte limit; 48 MB each once decoded), waits for every
answer, and reports the server's peak resident memory (the kernel's high-water mark, VmHWM), the
answers by status and how long a refusal took. The floor is a peak under 1.5 GB.

Linux only (reads /proc). Bounded: every request and the whole run have timeouts, and the server is
stopped (SIGTERM, then SIGKILL) whatever happens.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from ssr_server.bench.report import write_json

FLOOR_PEAK_MB = 1536.0


@dataclass
class OverloadResult:
    running: int
    queued: int
    capacity: int
    sent: int
    images_per_request: int
    image_pixels: int
    image_bytes: int
    keep_pixels: int | None
    decode_concurrency: int
    prefix_cache_mb: int
    statuses: dict[str, int]
    refused_p50_s: float
    refused_max_s: float
    completed_max_s: float
    baseline_rss_mb: float
    peak_rss_mb: float
    wall_s: float
    floor_peak_mb: float = FLOOR_PEAK_MB
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.peak_rss_mb < self.floor_peak_mb and not self.notes


def png_variants(width: int, height: int, count: int) -> list[bytes]:
    """``count`` distinct RGB PNGs of ``width`` x ``height``: vertical colour bands (PNG's Up filter
    makes every row after the first a run of zeros) and a last row of its own per variant. The shared
    rows are compressed once and the compressor state copied per variant, so making hundreds of 16 MP
    images costs seconds, not minutes."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")

    first = bytes([0]) + bytes((x * 7 + (x // 97) * 40) % 256 for x in range(width * 3))
    same = bytes([2]) + bytes(width * 3)  # filter Up, no change: the row above again
    comp = zlib.compressobj(6)
    head = comp.compress(first) + b"".join(comp.compress(same) for _ in range(height - 2))
    ihdr = chunk(b"IHDR", width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0]))
    out = []
    for i in range(count):
        tail = comp.copy()
        last = bytes([0]) + i.to_bytes(8, "big") * (width * 3 // 8) + bytes(width * 3 % 8)
        idat = head + tail.compress(last) + tail.flush()
        out.append(b"\x89PNG\r\n\x1a\n" + ihdr + chunk(b"IDAT", idat) + chunk(b"IEND", b""))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def status_kb(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return float(line.split()[1])
    raise KeyError(key)


@contextlib.contextmanager
def server_process(env: dict[str, str], model: str | None,
                   start_timeout_s: float) -> Iterator[tuple[str, int]]:
    """A real ``ssr-server serve`` in a subprocess on 127.0.0.1 (its URL and pid), stopped on exit."""
    port = free_port()
    cmd = [sys.executable, "-m", "ssr_server.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--log-level", "warning"]
    if model:
        cmd += ["--model", model]
    proc = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited during start-up ({proc.returncode})")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/ready", timeout=5).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the server was not ready within {start_timeout_s:g} s")
            time.sleep(0.2)
        yield url, proc.pid
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)


async def _fire(url: str, bodies: list[bytes], timeout_s: float) -> list[tuple[int, float]]:
    """Send every body at once (one connection each); (status, seconds) per request, 0 = no answer."""
    limits = httpx.Limits(max_connections=len(bodies) + 4, max_keepalive_connections=0)
    start = asyncio.Event()
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s, limits=limits) as client:

        async def one(body: bytes) -> tuple[int, float]:
            await start.wait()
            t0 = time.perf_counter()
            try:
                r = await client.post("/v1/agent/runs", content=body,
                                      headers={"content-type": "application/json"})
                return r.status_code, time.perf_counter() - t0
            except httpx.HTTPError:
                return 0, time.perf_counter() - t0

        tasks = [asyncio.create_task(one(b)) for b in bodies]
        await asyncio.sleep(0)  # every task waits on the start line
        start.set()
        return list(await asyncio.gather(*tasks))


def run_overload_bench(*, running: int = 16, queued: int = 64, factor: int = 4, images: int = 4,
                       width: int = 4000, height: int = 4000, keep_pixels: int | None = None,
                       decode_concurrency: int = 2, prefix_cache_mb: int | None = None, max_turns: int = 1,
                       model: str | None = None, timeout_s: float = 600.0,
                       json_path: str | None = None) -> OverloadResult:
    """Run the bench. ``keep_pixels``: None leaves SSR_IMAGE_KEEP_PIXELS at the server's default, 0
    keeps images at full size, N downscales to N pixels. ``prefix_cache_mb``: the engine's KV cache
    bound (None: the server's default); the cache keeps every finished run's context up to it, so it
    grows with the runs served, overload or not."""
    from ssr_server.core.config import Settings

    capacity = running + queued
    sent = factor * capacity
    pngs = png_variants(width, height, sent * images)
    image_bytes = max((len(p) for p in pngs), default=0)
    b64 = [base64.b64encode(p).decode() for p in pngs]
    del pngs
    bodies = [json.dumps({"question": "What is in these pictures?", "mode": "ssr", "max_turns": max_turns,
                          "images": b64[i * images:(i + 1) * images]}).encode() for i in range(sent)]
    del b64
    env = {"SSR_MAX_CONCURRENT_RUNS": str(running), "SSR_MAX_QUEUED_RUNS": str(queued),
           "SSR_IMAGE_DECODE_CONCURRENCY": str(decode_concurrency), "SSR_RUN_DEADLINE_S": str(timeout_s),
           "SSR_DRAIN_TIMEOUT_S": "5", "HF_HUB_OFFLINE": "1"}
    effective_keep = Settings().image_keep_pixels
    cache_mb = Settings().prefix_cache_mb if prefix_cache_mb is None else prefix_cache_mb
    env["SSR_PREFIX_CACHE_MB"] = str(cache_mb)
    if keep_pixels is not None:
        effective_keep = keep_pixels or None
        env["SSR_IMAGE_KEEP_PIXELS"] = str(keep_pixels or 10**12)  # 10**12: above any image allowed in
    t0 = time.perf_counter()
    with server_process(env, model, start_timeout_s=300.0) as (url, pid):
        baseline_mb = status_kb(pid, "VmRSS") / 1024
        answers = asyncio.run(asyncio.wait_for(_fire(url, bodies, timeout_s), timeout_s + 60))
        peak_mb = status_kb(pid, "VmHWM") / 1024
        ready = httpx.get(f"{url}/ready", timeout=30).json()
    wall = time.perf_counter() - t0
    statuses = Counter(str(s) for s, _ in answers)
    refused = sorted(t for s, t in answers if s == 429)
    notes = []
    if statuses.get("0"):
        notes.append(f"{statuses['0']} requests got no answer")
    bad = {k: v for k, v in statuses.items() if k not in ("200", "429")}
    if bad:
        notes.append(f"answers other than 200 or 429: {bad}")
    if ready.get("runs_in_flight") or ready.get("runs_queued"):
        notes.append(f"the server still held work afterwards: {ready}")
    result = OverloadResult(
        running=running, queued=queued, capacity=capacity, sent=sent, images_per_request=images,
        image_pixels=width * height, image_bytes=image_bytes, keep_pixels=effective_keep,
        decode_concurrency=decode_concurrency, prefix_cache_mb=cache_mb,
        statuses=dict(sorted(statuses.items())),
        refused_p50_s=refused[len(refused) // 2] if refused else 0.0,
        refused_max_s=refused[-1] if refused else 0.0,
        completed_max_s=max((t for s, t in answers if s == 200), default=0.0),
        baseline_rss_mb=baseline_mb, peak_rss_mb=peak_mb, wall_s=wall, notes=notes)
    if json_path:
        write_json(json_path, {**asdict(result), "passed": result.passed})
    return result


def format_table(r: OverloadResult) -> str:
    keep = "full size" if r.keep_pixels is None else f"{r.keep_pixels / 1e6:.1f} MP"
    lines = [
        f"capacity {r.capacity} ({r.running} running + {r.queued} queued); sent {r.sent} at once, "
        f"{r.images_per_request} x {r.image_pixels / 1e6:.0f} MP PNG each (<= {r.image_bytes / 1024:.0f} KB)",
        f"kept images: {keep}; decodes at once: {r.decode_concurrency}; prefix KV cache bound "
        f"{r.prefix_cache_mb} MB",
        f"answers: {r.statuses}",
        f"429 after: p50 {r.refused_p50_s:.3f} s, max {r.refused_max_s:.3f} s; "
        f"last 200 after {r.completed_max_s:.1f} s",
        f"server RSS: {r.baseline_rss_mb:.0f} MB idle, peak {r.peak_rss_mb:.0f} MB "
        f"(floor < {r.floor_peak_mb:.0f} MB): {'PASS' if r.passed else 'FAIL'}",
    ]
    lines += [f"note: {n}" for n in r.notes]
    return "\n".join(lines)

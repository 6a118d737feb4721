"""What tracing costs a server: the same closed-loop ssr load with tracing off and on, side by side.

One engine and one tool registry; for each repeat, each variant gets a fresh real server (uvicorn on
127.0.0.1, ``bench.serve``'s) started under its ``OTEL_*`` variables, the engine's prefix cache emptied,
then the same runs (same seeds) from ``concurrency`` clients. Variants, interleaved so that a noisy
stretch of a shared machine falls on all of them:

- ``off``: no ``OTEL_*`` (the default: what a server without them does, the agent's spans are no-ops);
- ``on``: every request traced (``OTEL_TRACES_SAMPLER=always_on``), exported over OTLP/HTTP to a
  receiver in this process (it reads each payload and answers 200, as a collector would).

Each variant reports its median-throughput repeat's runs/s and latency percentiles over all its
repeats' runs; the figures of merit are on/off for throughput and per-turn reasoning p95.
``noop_span_ns`` is what one span of the agent costs when tracing is off.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ssr_server.bench.report import write_json
from ssr_server.bench.serve import _free_port, _level, _serve
from ssr_server.core import tracing
from ssr_server.loadtest.generator import run_load
from ssr_server.loadtest.records import LoadResult
from ssr_server.loadtest.report import percentiles

VARIANTS: dict[str, dict[str, str]] = {
    "off": {},
    "on": {"OTEL_TRACES_SAMPLER": "always_on", "OTEL_SERVICE_NAME": "ssr-bench"},
}
TOLERANCE = 0.05  # the bound for tracing on, ratio 1.0
SPANS_PER_TURN = 4  # ssr.turn, ssr.select, ssr.action, ssr.tool (most turns)


class _Sink(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(n)
        counts = self.server.counts  # type: ignore[attr-defined]
        counts["requests"] += 1
        counts["bytes"] += n
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _otlp_sink() -> Iterator[tuple[str, dict[str, int]]]:
    httpd = ThreadingHTTPServer(("127.0.0.1", _free_port()), _Sink)
    counts = {"requests": 0, "bytes": 0}
    httpd.counts = counts  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1/traces", counts
    finally:
        httpd.shutdown()
        httpd.server_close()


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def noop_span_ns(n: int = 200_000) -> float:
    """Nanoseconds per agent span with tracing off (enter, two attributes, exit)."""
    assert not tracing.enabled()
    t0 = time.perf_counter_ns()
    for i in range(n):
        with tracing.span("ssr.bench", {"ssr.i": i}) as s:
            s.set({"ssr.j": i})
    return (time.perf_counter_ns() - t0) / n


def run_tracing_bench(model: str | None = None, concurrency: int = 4, runs: int = 32, repeats: int = 3,
                      max_turns: int = 4, json_path: str | None = None, timeout_s: float = 300.0,
                      ) -> dict[str, Any]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from ssr_server.api.app import build_tools
    from ssr_server.core.config import Settings
    from ssr_server.engine.factory import build_engine

    if concurrency < 1 or runs < 1 or repeats < 1:
        raise ValueError("concurrency, runs and repeats must be >= 1")
    settings = Settings(model=model, max_concurrent_runs=concurrency,
                        max_queued_runs=max(64, 2 * concurrency), run_deadline_s=timeout_s)
    tracing.shutdown()
    noop = noop_span_ns()
    engine = build_engine(settings)
    tools = build_tools(settings)
    samples: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    pooled: dict[str, list[LoadResult]] = {v: [] for v in VARIANTS}
    exported: dict[str, int] = {}
    try:
        with _otlp_sink() as (sink_url, counts):
            for r in range(repeats):
                for name, env in VARIANTS.items():
                    extra = {**env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": sink_url} if env else {}
                    with _environ(extra):
                        sent = counts["bytes"]
                        with _serve(settings, engine, tools) as (url, _):
                            assert tracing.enabled() == bool(env), name

                            async def load(n: int, seed: int, url: str = url) -> LoadResult:
                                return await run_load(url, concurrency=concurrency, requests=n,
                                                      duration_s=timeout_s * 4, modes={"ssr": 1.0},
                                                      with_images=1.0, max_turns=max_turns,
                                                      timeout_s=timeout_s, slo_s=timeout_s, seed=seed,
                                                      tau=1.0)

                            asyncio.run(load(concurrency, 7919 + r))  # warm-up: lazy imports, allocator
                            cache = getattr(engine, "prefix_cache", None)
                            if cache is not None:
                                cache.clear()
                            cpu0 = time.process_time()
                            result = asyncio.run(load(runs, 0))
                        tracing.shutdown()  # exports what is left
                        cpu_s = time.process_time() - cpu0  # every thread: engine, server, exporter
                        exported[name] = exported.get(name, 0) + counts["bytes"] - sent
                    pooled[name].append(result)
                    lv = _level(result, concurrency, {})
                    lv["cpu_ms_per_run"] = cpu_s / max(1, lv["completed"]) * 1e3
                    lv["load_avg_1m"] = os.getloadavg()[0]
                    samples[name].append(lv)
    finally:
        tracing.shutdown()
        asyncio.run(tools.aclose())
        asyncio.run(engine.close())
    variants = {}
    for name, lvs in samples.items():
        # throughput: the median repeat; latencies: percentiles over every repeat's runs pooled (more
        # samples than one repeat's, so a p95 is less at the mercy of one noisy stretch)
        ordered = sorted(lvs, key=lambda lv: lv["runs_per_s"])
        chosen = dict(ordered[len(ordered) // 2])
        chosen["runs_per_s_samples"] = [lv["runs_per_s"] for lv in lvs]
        cpu = sorted(lv["cpu_ms_per_run"] for lv in lvs)
        chosen["cpu_ms_per_run"] = cpu[len(cpu) // 2]
        chosen["cpu_ms_per_run_samples"] = [lv["cpu_ms_per_run"] for lv in lvs]
        done = [r for res in pooled[name] for r in res.records if r.fate == "completed"]
        rea = percentiles([x for r in done for x in r.reasoning_s], (50, 95))
        lat = percentiles([r.latency_s for r in done], (50, 95))
        chosen.update(reasoning_p50_s=rea["p50"], reasoning_p95_s=rea["p95"], latency_p50_s=lat["p50"],
                      latency_p95_s=lat["p95"], completed=len(done), otlp_bytes=exported.get(name, 0))
        variants[name] = chosen
    off, on = variants["off"], variants["on"]
    out: dict[str, Any] = {
        "bench": "serve --tracing", "model": model or "tiny (offline Qwen3-VL)", "engine": engine.name,
        "concurrency": concurrency, "runs": runs, "repeats": repeats, "max_turns": max_turns,
        "cpu_count": os.cpu_count(), "variants": variants,
        "throughput_on_over_off": on["runs_per_s"] / off["runs_per_s"] if off["runs_per_s"] else None,
        "reasoning_p95_on_over_off": (on["reasoning_p95_s"] / off["reasoning_p95_s"]
                                      if off["reasoning_p95_s"] else None),
        # CPU seconds of the whole process per run: what tracing costs, little moved by other processes
        "cpu_on_over_off": on["cpu_ms_per_run"] / off["cpu_ms_per_run"] if off["cpu_ms_per_run"] else None,
        "noop_span_ns": noop,
        # the spans of a median run with tracing off (a run span, SPANS_PER_TURN per turn), as a share of it
        "noop_share_of_run": (noop * 1e-9 * (1 + SPANS_PER_TURN * off["turns_mean"]) / off["latency_p50_s"]
                              if off["latency_p50_s"] else None),
        "tolerance": TOLERANCE,
    }
    if json_path:
        write_json(json_path, out)
    return out


def format_tracing(result: dict[str, Any]) -> str:
    head = (f"{'tracing':<8} {'ok':>4} {'runs/s':>7} {'turns/s':>8} {'reason p50':>10} {'p95':>6} "
            f"{'run p50':>8} {'p95':>7} {'CPU ms/run':>10} {'OTLP kB':>8}  runs/s per repeat")
    lines = [f"tracing cost: {result['model']} ({result['engine']}), {result['concurrency']} concurrent ssr "
             f"runs, {result['runs']} runs x {result['repeats']} repeat(s) per variant, interleaved, "
             f"{result['cpu_count']} CPUs", head, "-" * len(head)]
    for name, lv in result["variants"].items():
        lines.append(
            f"{name:<8} {lv['completed']:>4} {lv['runs_per_s']:>7.2f} {lv['turns_per_s']:>8.2f} "
            f"{lv['reasoning_p50_s'] * 1e3:>10.1f} {lv['reasoning_p95_s'] * 1e3:>6.1f} "
            f"{lv['latency_p50_s'] * 1e3:>8.1f} {lv['latency_p95_s'] * 1e3:>7.1f} "
            f"{lv['cpu_ms_per_run']:>10.1f} {lv['otlp_bytes'] / 1e3:>8.1f}  "
            + ", ".join(f"{x:.2f}" for x in lv["runs_per_s_samples"]))
    lines.append("(runs/s and CPU: the median repeat; latency percentiles: all repeats' runs pooled)")
    tput, p95 = result["throughput_on_over_off"], result["reasoning_p95_on_over_off"]
    cpu, tol = result["cpu_on_over_off"], result["tolerance"]
    if tput is not None and p95 is not None and cpu is not None:
        ok = abs(tput - 1) <= tol and abs(p95 - 1) <= tol
        lines.append(f"on / off: throughput {tput:.3f}, reasoning p95 {p95:.3f} "
                     f"(within {tol:.0%}: {'yes' if ok else 'NO'}); CPU per run {cpu:.3f}")
    load = max(lv["load_avg_1m"] for lv in result["variants"].values())
    if load > (result["cpu_count"] or 1):
        lines.append(f"warning: load average {load:.1f} on {result['cpu_count']} CPUs: other processes "
                     "shared the machine; wall-clock figures are noisy, CPU per run much less so")
    share = result["noop_share_of_run"]
    lines.append(f"off: one agent span costs {result['noop_span_ns']:.0f} ns (a no-op); the spans of a "
                 f"median run, {'-' if share is None else f'{share:.1e}'} of it")
    return "\n".join(lines)


__all__ = ["format_tracing", "noop_span_ns", "run_tracing_bench"]

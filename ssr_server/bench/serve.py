"""Serving benchmark: one real server in process, closed-loop load at several concurrencies, side by side.

The server is the real app under a real uvicorn on 127.0.0.1 (a background thread), with the embedded
engine (the offline tiny Qwen3-VL unless ``model`` is given) and the demo tools. Each level sends the
same ``runs_per_level`` ssr runs (tau 1.0, per-run seeds, demo images) from ``c`` closed-loop clients,
after the engine's prefix cache is emptied, so every level does the same work from the same start.

The figure of merit is the scaling of throughput with concurrency: the floor is
``throughput(8) >= 3 x throughput(1)`` on the tiny model (the scheduler batches concurrent runs'
scoring, prefill and decode steps into shared forwards).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from ssr_server.bench.report import write_json
from ssr_server.loadtest.generator import run_load
from ssr_server.loadtest.records import LoadResult
from ssr_server.loadtest.report import percentiles

FLOOR_RATIO = 3.0
FLOOR_REASONING_SPREAD = 1.5  # per-turn reasoning p95 / p50 at the top concurrency


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _serve(settings: Any, engine: Any = None, tools: Any = None,
           timeout_s: float = 120.0) -> Iterator[tuple[str, threading.Thread]]:
    import uvicorn

    from ssr_server.api.app import create_app
    from ssr_server.api.connections import server_config

    port = _free_port()
    config = server_config(create_app(settings, engine=engine, tools=tools), settings, host="127.0.0.1",
                           port=port, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="ssr-bench-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("server thread died during start-up")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise TimeoutError("server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", thread
    finally:
        server.should_exit = True
        thread.join(15)


@contextlib.contextmanager
def live_server(settings: Any, engine: Any = None, tools: Any = None,
                timeout_s: float = 120.0) -> Iterator[str]:
    """A real uvicorn server on 127.0.0.1 (a free port) serving ``create_app(settings, engine, tools)``,
    in a background thread (the pattern of tests/conftest.py); yields its base URL."""
    with _serve(settings, engine, tools, timeout_s) as (url, _):
        yield url


def _thread_cpu_s(thread: threading.Thread | None) -> float | None:
    """CPU seconds a live thread has used so far (Linux: its pthread CPU clock); None if unknown."""
    if thread is None or thread.ident is None or not thread.is_alive():
        return None
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    except (AttributeError, OSError, OverflowError):
        return None


def _engine_cpu_s() -> dict[int, float]:
    """CPU seconds of the embedded engine's threads (its worker and its prefill lane), by thread id."""
    out: dict[int, float] = {}
    for t in threading.enumerate():
        if t.name.startswith("ssr-torch-") and t.ident is not None:
            cpu = _thread_cpu_s(t)
            if cpu is not None:
                out[t.ident] = cpu
    return out


class _CpuMeter:
    """CPU time by thread over one level: the engine (its worker and lane threads), the server's event
    loop, the client."""

    def __init__(self, engine: Any, server_thread: threading.Thread) -> None:
        self.threads = {"server": server_thread, "client": threading.current_thread()}
        self.start: dict[str, float | None] = {}
        self.t0 = 0.0
        self._engine = getattr(engine, "scheduler", None) is not None

    def _engine_total(self, since: dict[int, float]) -> float | None:
        if not self._engine:
            return None
        now = _engine_cpu_s()  # a thread started during the level counts from zero
        return sum(cpu - since.get(ident, 0.0) for ident, cpu in now.items()) if now else None

    def __enter__(self) -> _CpuMeter:
        self._engine_start = _engine_cpu_s()
        self.start = {k: _thread_cpu_s(t) for k, t in self.threads.items()}
        self.start["worker"] = 0.0 if self._engine else None
        self.start["process"] = time.process_time()
        return self

    def __exit__(self, *_: object) -> None:
        self.end = {k: _thread_cpu_s(t) for k, t in self.threads.items()}
        self.end["worker"] = self._engine_total(self._engine_start)
        self.end["process"] = time.process_time()

    def used(self) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for k, a in self.start.items():
            b = self.end.get(k)
            out[k] = None if a is None or b is None else b - a
        return out


def _level(result: LoadResult, concurrency: int, engine_delta: dict[str, float]) -> dict[str, Any]:
    recs = result.records
    done = [r for r in recs if r.fate == "completed"]
    span = (max(r.end_s for r in recs) - min(r.start_s for r in recs)) if recs else 0.0
    lat = percentiles([r.latency_s for r in done], (50, 95))
    rea = percentiles([x for r in done for x in r.reasoning_s], (50, 95))
    model = percentiles([r.model_s for r in done if r.model_s is not None], (50, 95))
    turns = sum(r.turns for r in done)
    return {
        "concurrency": concurrency,
        "runs": len(recs),
        "completed": len(done),
        "failed": sum(r.fate == "failed" for r in recs),
        "refused": sum(r.fate == "refused" for r in recs),
        "span_s": span,
        "runs_per_s": len(done) / span if span > 0 else 0.0,
        "turns_per_s": turns / span if span > 0 else 0.0,
        "turns_mean": turns / len(done) if done else 0.0,
        "latency_p50_s": lat["p50"], "latency_p95_s": lat["p95"],
        "reasoning_p50_s": rea["p50"], "reasoning_p95_s": rea["p95"],
        "model_p50_s": model["p50"], "model_p95_s": model["p95"],
        "outcomes": {o: sum(r.outcome == o for r in done) for o in sorted({str(r.outcome) for r in done})},
        **engine_delta,
    }


def _engine_counters(engine: Any) -> dict[str, float]:
    stats = getattr(engine, "stats", None)
    if not callable(stats):
        return {}
    s = stats()
    return {k: float(s[k]) for k in ("batches", "prefix_cache_hits", "prefix_cache_misses") if k in s}


def run_serve_bench(
    model: str | None = None,
    concurrencies: Sequence[int] = (1, 4, 8),
    runs_per_level: int = 32,
    max_turns: int = 4,
    json_path: str | None = None,
    *,
    seed: int = 0,
    tau: float = 1.0,
    with_images: float = 1.0,
    warmup_runs: int = 4,
    timeout_s: float = 300.0,
    progress: bool = False,
    repeats: int = 1,
    mixed: bool = True,
    mixed_only: bool = False,
    engine: Any = None,
    warm_start: bool = False,
) -> dict[str, Any]:
    """Throughput and latency of ssr runs at each concurrency, the same runs at every level.

    Returns ``{"model", "levels": [...], "ratio", "ratio_levels", "floor", "floor_met", ...}`` where
    ``ratio`` is throughput(max concurrency) / throughput(min concurrency); writes it to ``json_path``.
    With ``repeats`` > 1 the levels are run that many times, interleaved (1, 4, 8, 1, 4, 8, ...), and
    each level reports its median-throughput repeat (all samples in ``runs_per_s_samples``): on a
    shared machine this keeps one noisy stretch from deciding the ratio.

    ``mixed``: first the engine-level mixed-load case (``bench/mixed.py``: inter-token latency of one
    decoding run while another prefills a ~4,000-token context), in ``result["mixed"]``; ``mixed_only``
    skips the load levels. ``engine``: an already built embedded engine to measure (side-by-side
    comparisons in one process; it is not closed), instead of one built from the settings.
    ``warm_start``: after emptying the cache, one untimed run puts the shared system prompt back (a
    server's steady state) so that a level does not start with every run prefilling it at once.
    """
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from ssr_server.api.app import build_tools
    from ssr_server.core.config import Settings
    from ssr_server.engine.factory import build_engine, resolve_model

    levels_in = sorted({int(c) for c in concurrencies})
    if not levels_in or levels_in[0] < 1 or runs_per_level < 1:
        raise ValueError("concurrencies must be >= 1 and runs_per_level >= 1")
    top = levels_in[-1]
    settings = Settings(model=model, max_concurrent_runs=max(top, 1), max_queued_runs=max(64, 2 * top),
                        run_deadline_s=timeout_s)
    model_path = resolve_model(settings)
    t0 = time.perf_counter()
    own_engine = engine is None
    if engine is None:
        engine = build_engine(settings)
    load_s = time.perf_counter() - t0
    mixed_result = None
    if mixed or mixed_only:
        from ssr_server.bench.mixed import run_mixed_bench

        mixed_result = run_mixed_bench(engine, repeats=max(3, repeats))
    if mixed_only:
        if own_engine:
            asyncio.run(engine.close())
        return {"bench": "serve", "model": model or "tiny (offline Qwen3-VL)", "model_path": model_path,
                "engine": engine.name, "mixed": mixed_result, "levels": []}
    tools = build_tools(settings)
    mix = {"ssr": 1.0}
    samples: dict[int, list[dict[str, Any]]] = {c: [] for c in levels_in}
    try:
        with _serve(settings, engine, tools) as (url, server_thread):

            async def load(c: int, n: int, s: int) -> LoadResult:
                return await run_load(url, concurrency=c, requests=n, duration_s=timeout_s * 4, modes=mix,
                                      with_images=with_images, max_turns=max_turns, timeout_s=timeout_s,
                                      slo_s=timeout_s, seed=s, progress=progress, tau=tau)

            if warmup_runs > 0:  # first-call costs (allocator, image processor, lazy imports)
                asyncio.run(load(min(top, warmup_runs), warmup_runs, seed + 7919))
            for _ in range(max(1, repeats)):
                for c in levels_in:
                    cache = getattr(engine, "prefix_cache", None)
                    if cache is not None:
                        cache.clear()  # every level starts from the same (empty) cache
                    if warm_start:
                        asyncio.run(load(1, 1, seed + 104729))
                    before = _engine_counters(engine)
                    load_avg = os.getloadavg()[0]
                    with _CpuMeter(engine, server_thread) as meter:
                        result = asyncio.run(load(c, runs_per_level, seed))
                    after = _engine_counters(engine)
                    delta = {f"engine_{k}": after[k] - before.get(k, 0.0) for k in after}
                    lv = _level(result, c, delta)
                    n = max(1, lv["completed"])
                    for k, used in meter.used().items():
                        lv[f"{k}_cpu_s"] = used
                        lv[f"{k}_cpu_ms_per_run"] = None if used is None else used / n * 1e3
                    w = lv["worker_cpu_s"]
                    # what the engine could sustain with a core to itself: runs per worker-CPU second
                    lv["engine_capacity_rps"] = lv["completed"] / w if w else None
                    lv["worker_cpu_share"] = w / lv["span_s"] if w is not None and lv["span_s"] else None
                    lv["load_avg_1m"] = load_avg
                    samples[c].append(lv)
    finally:
        asyncio.run(tools.aclose())
        if own_engine:
            asyncio.run(engine.close())
    levels = []
    for c in levels_in:
        runs = sorted(samples[c], key=lambda lv: lv["runs_per_s"])
        chosen = dict(runs[len(runs) // 2])
        chosen["runs_per_s_samples"] = [lv["runs_per_s"] for lv in samples[c]]
        levels.append(chosen)
    base, best = levels[0], levels[-1]
    ratio = best["runs_per_s"] / base["runs_per_s"] if base["runs_per_s"] > 0 else 0.0
    cap_a, cap_b = base.get("engine_capacity_rps"), best.get("engine_capacity_rps")
    cpu_ratio = cap_b / cap_a if cap_a and cap_b else None
    out: dict[str, Any] = {
        "bench": "serve",
        "model": model or "tiny (offline Qwen3-VL)",
        "model_path": model_path,
        "engine": engine.name,
        "engine_load_s": load_s,
        "mode": "ssr",
        "warm_start": warm_start,
        "tau": tau,
        "max_turns": max_turns,
        "runs_per_level": runs_per_level,
        "repeats": max(1, repeats),
        "with_images": with_images,
        "levels": levels,
        "ratio": ratio,
        "ratio_levels": [base["concurrency"], best["concurrency"]],
        "floor": FLOOR_RATIO,
        "floor_met": ratio >= FLOOR_RATIO if (base["concurrency"], best["concurrency"]) == (1, 8) else None,
        "engine_capacity_ratio": cpu_ratio,
        "cpu_count": os.cpu_count(),
        "load_avg_1m_max": max(lv["load_avg_1m"] for c in levels_in for lv in samples[c]),
        "reasoning_spread": (best["reasoning_p95_s"] / best["reasoning_p50_s"]
                             if best["reasoning_p50_s"] else None),
        "reasoning_spread_floor": FLOOR_REASONING_SPREAD,
        "mixed": mixed_result,
    }
    if json_path:
        write_json(json_path, out)
    return out


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def format_table(result: dict[str, Any]) -> str:
    """Levels side by side; latencies in ms; CPU in ms per completed run, by thread; the mixed case."""
    from ssr_server.bench.mixed import format_mixed

    mixed = format_mixed(result["mixed"]) if result.get("mixed") else ""
    if not result["levels"]:
        return mixed
    return _levels_table(result) + ("\n" + mixed if mixed else "")


def _levels_table(result: dict[str, Any]) -> str:
    head = (f"{'conc':>4} {'ok':>4} {'runs/s':>7} {'turns/s':>8} {'reason p50':>10} {'p95':>6} "
            f"{'run p50':>8} {'p95':>7} {'fwds':>5} {'cpu/run: worker':>15} {'server':>7} {'client':>7} "
            f"{'worker share':>12} {'engine cap/s':>12}")
    lines = [f"serve bench: {result['model']} ({result['engine']}), mode {result['mode']}, "
             f"tau {result['tau']:g}, max_turns {result['max_turns']}, "
             f"{result['runs_per_level']} runs per level x {result['repeats']} repeat(s), "
             f"{result['cpu_count']} CPUs, "
             + ("warm start (prompt cached)" if result.get("warm_start") else "cold start (empty cache)"),
             head, "-" * len(head)]
    for lv in result["levels"]:
        share = lv.get("worker_cpu_share")
        cpu = [_num(lv.get(f"{k}_cpu_ms_per_run"), ".1f") for k in ("worker", "server", "client")]
        cap = _num(lv.get("engine_capacity_rps"), ".2f")
        lines.append(
            f"{lv['concurrency']:>4} {lv['completed']:>4} {lv['runs_per_s']:>7.2f} {lv['turns_per_s']:>8.2f} "
            f"{_ms(lv['reasoning_p50_s']):>10} {_ms(lv['reasoning_p95_s']):>6} {_ms(lv['latency_p50_s']):>8} "
            f"{_ms(lv['latency_p95_s']):>7} {int(lv.get('engine_batches', 0)):>5} "
            f"{cpu[0]:>15} {cpu[1]:>7} {cpu[2]:>7} {'-' if share is None else f'{share:.0%}':>12} {cap:>12}")
        if len(lv["runs_per_s_samples"]) > 1:
            lines.append(f"{'':>4} runs/s over {len(lv['runs_per_s_samples'])} repeats: "
                         + ", ".join(f"{x:.2f}" for x in lv["runs_per_s_samples"]))
    a, b = result["ratio_levels"]
    verdict = ""
    if result["floor_met"] is not None:
        verdict = f"  (floor {result['floor']:g}x: {'met' if result['floor_met'] else 'NOT met'})"
    lines.append(f"throughput({b}) / throughput({a}) = {result['ratio']:.2f}x{verdict}")
    top = result["levels"][-1]
    if top["reasoning_p50_s"]:
        spread = top["reasoning_p95_s"] / top["reasoning_p50_s"]
        ok = "met" if spread <= FLOOR_REASONING_SPREAD else "NOT met"
        lines.append(f"per-turn reasoning p95 / p50 at {b} concurrent runs = {spread:.2f} "
                     f"(floor <= {FLOOR_REASONING_SPREAD:g}: {ok})")
    if result.get("engine_capacity_ratio") is not None:
        lines.append(f"engine capacity({b}) / capacity({a}) = {result['engine_capacity_ratio']:.2f}x "
                     "(runs per CPU-second of the engine worker: batching efficiency, immune to other load)")
    if result.get("load_avg_1m_max", 0) > (result.get("cpu_count") or 1):
        lines.append(f"warning: load average reached {result['load_avg_1m_max']:.1f} on "
                     f"{result['cpu_count']} CPUs: other processes shared the machine, wall-clock figures "
                     "are pessimistic and noisy")
    return "\n".join(lines)


__all__ = ["FLOOR_RATIO", "format_table", "live_server", "run_serve_bench"]

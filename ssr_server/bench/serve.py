"""Serving benchmark: one real server in process, closed-loop load at several concurrencies, side by side.

The server is the real app under a real uvicorn on 127.0.0.1 (a background thread), with the embedded
engine (the offline tiny Qwen3-VL unless ``model`` is given) and the demo tools. Each level sends the
same ``runs_per_level`` ssr runs (tau 1.0, per-run seeds, demo images) from ``c`` closed-loop clients,
after the engine's prefix cache is emptied, so every level does the same work from the same start.

The figure of merit is the scaling of throughput with concurrency: the floor is
``throughput(8) >= 2.5 x throughput(1)`` on the tiny model (the scheduler batches concurrent runs'
scoring, prefill and decode steps into shared forwards).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ssr_server.loadtest.generator import LoadResult, run_load
from ssr_server.loadtest.report import percentiles

FLOOR_RATIO = 2.5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def live_server(settings: Any, engine: Any = None, tools: Any = None, timeout_s: float = 120.0) -> Iterator[str]:
    """A real uvicorn server on 127.0.0.1 (random free port) serving ``create_app(settings, engine, tools)``."""
    import uvicorn

    from ssr_server.api.app import create_app

    port = _free_port()
    config = uvicorn.Config(create_app(settings, engine=engine, tools=tools), host="127.0.0.1", port=port,
                            log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
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
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)


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
) -> dict[str, Any]:
    """Throughput and latency of ssr runs at each concurrency, the same runs at every level.

    Returns ``{"model", "levels": [...], "ratio", "ratio_levels", "floor", "floor_met", ...}`` where
    ``ratio`` is throughput(max concurrency) / throughput(min concurrency); writes it to ``json_path``.
    """
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from ssr_server.api.app import build_tools
    from ssr_server.config import Settings
    from ssr_server.engine.factory import build_engine, resolve_model

    levels_in = sorted({int(c) for c in concurrencies})
    if not levels_in or levels_in[0] < 1 or runs_per_level < 1:
        raise ValueError("concurrencies must be >= 1 and runs_per_level >= 1")
    top = levels_in[-1]
    settings = Settings(model=model, max_concurrent_runs=max(top, 1), max_queued_runs=max(64, 2 * top),
                        run_deadline_s=timeout_s)
    model_path = resolve_model(settings)
    t0 = time.perf_counter()
    engine = build_engine(settings.model_copy(update={"model": model_path}))
    load_s = time.perf_counter() - t0
    tools = build_tools(settings)
    mix = {"ssr": 1.0}
    levels: list[dict[str, Any]] = []
    try:
        with live_server(settings, engine, tools) as url:

            async def load(c: int, n: int, s: int) -> LoadResult:
                return await run_load(url, concurrency=c, requests=n, duration_s=timeout_s * 4, modes=mix,
                                      with_images=with_images, max_turns=max_turns, timeout_s=timeout_s,
                                      slo_s=timeout_s, seed=s, progress=progress, tau=tau)

            if warmup_runs > 0:  # first-call costs (allocator, image processor, lazy imports)
                asyncio.run(load(min(top, warmup_runs), warmup_runs, seed + 7919))
            for c in levels_in:
                cache = getattr(engine, "prefix_cache", None)
                if cache is not None:
                    cache.clear()  # every level starts from the same (empty) cache
                before = _engine_counters(engine)
                result = asyncio.run(load(c, runs_per_level, seed))
                after = _engine_counters(engine)
                delta = {f"engine_{k}": after[k] - before.get(k, 0.0) for k in after}
                levels.append(_level(result, c, delta))
    finally:
        asyncio.run(tools.aclose())
        asyncio.run(engine.close())
    base, best = levels[0], levels[-1]
    ratio = best["runs_per_s"] / base["runs_per_s"] if base["runs_per_s"] > 0 else 0.0
    out: dict[str, Any] = {
        "bench": "serve",
        "model": model or "tiny (offline Qwen3-VL)",
        "model_path": model_path,
        "engine": engine.name,
        "engine_load_s": load_s,
        "mode": "ssr",
        "tau": tau,
        "max_turns": max_turns,
        "runs_per_level": runs_per_level,
        "with_images": with_images,
        "levels": levels,
        "ratio": ratio,
        "ratio_levels": [base["concurrency"], best["concurrency"]],
        "floor": FLOOR_RATIO,
        "floor_met": ratio >= FLOOR_RATIO if (base["concurrency"], best["concurrency"]) == (1, 8) else None,
        "cpu_count": os.cpu_count(),
    }
    if json_path:
        p = Path(json_path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(out, indent=1))
    return out


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def format_table(result: dict[str, Any]) -> str:
    head = (f"{'conc':>4} {'runs':>5} {'ok':>4} {'runs/s':>7} {'turns/s':>8} {'turns':>6} "
            f"{'reason p50 ms':>13} {'p95':>7} {'run p50 ms':>11} {'p95':>8} {'batches':>8}")
    lines = [f"serve bench: {result['model']} ({result['engine']}), mode {result['mode']}, tau {result['tau']:g}, "
             f"max_turns {result['max_turns']}, {result['runs_per_level']} runs per level", head,
             "-" * len(head)]
    for lv in result["levels"]:
        lines.append(
            f"{lv['concurrency']:>4} {lv['runs']:>5} {lv['completed']:>4} {lv['runs_per_s']:>7.2f} "
            f"{lv['turns_per_s']:>8.2f} {lv['turns_mean']:>6.2f} {_ms(lv['reasoning_p50_s']):>13} "
            f"{_ms(lv['reasoning_p95_s']):>7} {_ms(lv['latency_p50_s']):>11} {_ms(lv['latency_p95_s']):>8} "
            f"{int(lv.get('engine_batches', 0)):>8}")
    a, b = result["ratio_levels"]
    verdict = ""
    if result["floor_met"] is not None:
        verdict = f"  (floor {result['floor']:g}x: {'met' if result['floor_met'] else 'NOT met'})"
    lines.append(f"throughput({b}) / throughput({a}) = {result['ratio']:.2f}x{verdict}")
    return "\n".join(lines)


__all__ = ["FLOOR_RATIO", "format_table", "live_server", "run_serve_bench"]

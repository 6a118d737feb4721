"""Run store benchmark: reading a large store, and what storing costs a run, side by side in one process.

1. **Reads at scale**: a SQLite store filled with ``runs`` finished runs (three turns each, the size of
   real ones), served by a real server on 127.0.0.1; ``samples`` timed requests each of: the first page of
   the list, a page filtered by outcome, a page deep in the list (cursor), and one run fetched whole.
   The floor: each p95 under 50 ms.
2. **Cost of storing**: the same closed-loop load (``concurrency`` clients, ssr runs with the demo image)
   on the same engine against a server with the store off and one on SQLite, interleaved ``repeats``
   times; the run latency ratio on/off. The floor: storing adds under 5 %.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from ssr_server.bench.report import write_json
from ssr_server.bench.serve import live_server
from ssr_server.core.summary import percentiles

READ_FLOOR_S = 0.050
COST_FLOOR = 1.05
OUTCOMES = ("answered", "answered", "answered", "max_turns", "error")


def _turn(i: int, rng: random.Random) -> dict[str, Any]:
    """A turn the size of a real one (six scores, a rationale, a tool call, a ~700-character observation)."""
    q = [rng.random() for _ in range(6)]
    total = sum(q)
    return {
        "index": i, "mode": "ssr", "candidate_id": "r_LOOKUP_FACT",
        "reasoning": "I can tell what the entity in the image is, but I do not know the particular fact the "
                     "question is asking about, so I should look that information up.",
        "scores": [-rng.random() * 2 for _ in range(6)], "q": [x / total for x in q], "left_out": {},
        "action_type": "text_search", "tool_name": "text_search_tool", "argument": '{"query": "x height"}',
        "arguments": {"query": "x height"}, "action_text": '\n<tool_call>\n{"name": "text_search_tool", '
        '"arguments": {"query": "x height"}}\n</tool_call>',
        "observation": "Gomis Lighthouse\nhttps://world.ssr-server.invalid/wiki/gomis-lighthouse#height\n"
                       "Surveyors measured the height of the Gomis Lighthouse at 367 metres.\n\n" * 5,
        "observation_ok": True, "tool_data": {"query": "x height", "hits": []}, "reasoning_span": [100, 130],
        "action_span": [131, 150], "error": None, "context_tokens": 900 + 200 * i, "cached_tokens": 800,
        "scored_tokens": 357, "reasoning_tokens": 0, "action_tokens": 19, "reasoning_s": 0.2,
        "action_s": 0.3, "tool_s": 0.01, "turn_s": 0.52,
    }


async def _fill(url: str, runs: int, seed: int) -> list[str]:
    """``runs`` finished runs written in bulk (as the server would have, in far fewer transactions)."""
    from sqlalchemy import insert

    from ssr_server.core.config import Settings
    from ssr_server.store.backends import open_store
    from ssr_server.store.models import RunRow, TurnRow

    store = await open_store(Settings(run_store=url, run_store_max_runs=0, run_store_ttl_s=0))
    assert store is not None
    rng = random.Random(seed)
    ids: list[str] = []
    now = time.time()
    try:
        for start in range(0, runs, 1000):
            rows, turns = [], []
            for i in range(start, min(runs, start + 1000)):
                rid = f"bench{i:07d}"
                ids.append(rid)
                t0 = now - (runs - i) * 5.0
                rows.append({"id": rid, "status": "completed", "mode": "ssr", "library": "default",
                             "question": f"How tall is landmark {i}?", "outcome": rng.choice(OUTCOMES),
                             "answer": "367 metres", "error": None, "background": False, "owner": None,
                             "created_at": t0, "started_at": t0, "finished_at": t0 + 1.6, "total_s": 1.6,
                             "model_s": 1.5, "tool_s": 0.03, "n_turns": 3, "n_images": 0,
                             "options": {"seed": i, "tau": 1.0, "max_turns": 4},
                             "usage": {"prompt_tokens": 1500}})
                turns += [{"run_id": rid, "idx": k, "data": _turn(k, rng)} for k in range(3)]
            async with store.engine.begin() as conn:
                await conn.execute(insert(RunRow), rows)
                await conn.execute(insert(TurnRow), turns)
    finally:
        await store.close()
    return ids


def _timed(client: httpx.Client, path: str, params: dict[str, Any] | None = None) -> float:
    t0 = time.perf_counter()
    r = client.get(path, params=params)
    took = time.perf_counter() - t0
    if r.status_code != 200:
        raise RuntimeError(f"GET {path}: {r.status_code} {r.text[:200]}")
    return took


def _reads(engine: Any, tools: Any, url: str, ids: list[str], samples: int, seed: int) -> dict[str, Any]:
    from ssr_server.core.config import Settings

    rng = random.Random(seed)
    out: dict[str, Any] = {}
    settings = Settings(run_store=url, run_store_max_runs=0, run_store_ttl_s=0)
    with live_server(settings, engine, tools) as base, httpx.Client(base_url=base, timeout=30) as client:
        cases = {
            "list_first_page": lambda: _timed(client, "/v1/agent/runs", {"limit": 20}),
            "list_by_outcome": lambda: _timed(client, "/v1/agent/runs",
                                              {"limit": 20, "outcome": "max_turns"}),
            "list_deep_cursor": lambda: _timed(client, "/v1/agent/runs",
                                               {"limit": 20, "after": rng.choice(ids)}),
            "fetch_run": lambda: _timed(client, f"/v1/agent/runs/{rng.choice(ids)}"),
        }
        for fn in cases.values():  # warm: connections, statement caches
            fn()
        timings: dict[str, list[float]] = {k: [] for k in cases}
        for _ in range(samples):  # interleaved, so that a noisy stretch hits every case alike
            for k, fn in cases.items():
                timings[k].append(fn())
        for k, v in timings.items():
            p = percentiles(v, (50, 95))
            out[k] = {"p50_ms": (p["p50"] or 0) * 1e3, "p95_ms": (p["p95"] or 0) * 1e3, "n": len(v)}
    return out


def _cost(engine: Any, tools: Any, concurrency: int, runs: int, repeats: int, max_turns: int,
          seed: int) -> dict[str, Any]:
    from ssr_server.core.config import Settings
    from ssr_server.loadtest.generator import run_load

    samples: dict[str, list[dict[str, float]]] = {"off": [], "sqlite": []}

    def load(base: str, n: int) -> Any:
        return asyncio.run(run_load(base, concurrency=concurrency, requests=n, duration_s=3600,
                                    modes={"ssr": 1.0}, with_images=1.0, max_turns=max_turns, timeout_s=300,
                                    slo_s=300, seed=seed, progress=False, tau=1.0))

    with live_server(Settings(run_store="off", max_concurrent_runs=concurrency), engine, tools) as base:
        load(base, concurrency)  # untimed: first-call costs (allocator, image processor, lazy imports)
    with tempfile.TemporaryDirectory(prefix="ssr-bench-store-") as tmp:
        for rep in range(repeats):
            for name in ("off", "sqlite") if rep % 2 == 0 else ("sqlite", "off"):
                store = "off" if name == "off" else f"sqlite:///{Path(tmp) / f'runs{rep}.sqlite3'}"
                settings = Settings(run_store=store, max_concurrent_runs=concurrency,
                                    max_queued_runs=4 * concurrency)
                with live_server(settings, engine, tools) as base:
                    cache = getattr(engine, "prefix_cache", None)
                    if cache is not None:
                        cache.clear()
                    cpu0 = time.process_time()  # every thread: engine, server, store, client alike
                    res = load(base, runs)
                    cpu_s = time.process_time() - cpu0
                done = [r for r in res.records if r.fate == "completed"]
                _say(f"store {name}, repeat {rep + 1}/{repeats}: {len(done)} runs done")
                span = max(r.end_s for r in res.records) - min(r.start_s for r in res.records)
                lat = percentiles([r.latency_s for r in done], (50, 95))
                samples[name].append({"completed": len(done), "runs_per_s": len(done) / span,
                                      "cpu_ms_per_run": cpu_s / max(1, len(done)) * 1e3,
                                      "latency_mean_s": sum(r.latency_s for r in done) / max(1, len(done)),
                                      "model_s_per_run": (sum(r.model_s or 0.0 for r in done)
                                                          / max(1, len(done))),
                                      "latency_p50_s": lat["p50"] or 0.0, "latency_p95_s": lat["p95"] or 0.0})
    # Each repeat is a side-by-side pair (off and on, one after the other): ratios per pair, then their
    # median, so that the machine's load drifting between pairs does not enter the ratio.
    pairs = list(zip(samples["off"], samples["sqlite"], strict=True))

    def ratio(metric: str) -> float:
        return statistics.median(on[metric] / off[metric] for off, on in pairs)

    # How far the median could move with other pairs: the machine's drift between passes (other tenants,
    # clock) is often larger than the store's cost, so the interval says whether a ratio means anything.
    pair_lat = [on["latency_mean_s"] / off["latency_mean_s"] for off, on in pairs]
    rng = random.Random(seed)
    boots = sorted(statistics.median(rng.choices(pair_lat, k=len(pair_lat))) for _ in range(2000))

    median = {k: {m: statistics.median(s[m] for s in v) for m in v[0]} for k, v in samples.items()}
    return {"concurrency": concurrency, "runs": runs, "repeats": repeats, "max_turns": max_turns,
            "samples": samples, "median": median, "latency_ratio": ratio("latency_mean_s"),
            "latency_ratio_interval": [boots[len(boots) // 20], boots[-len(boots) // 20 - 1]],
            "latency_ratio_pooled": (sum(s["latency_mean_s"] for s in samples["sqlite"])
                                     / sum(s["latency_mean_s"] for s in samples["off"])),
            "model_ratio": ratio("model_s_per_run"),
            "throughput_ratio": ratio("runs_per_s"), "cpu_ratio": ratio("cpu_ms_per_run")}


def run_runstore_bench(runs: int = 10_000, samples: int = 200, *, model: str | None = None,
                       concurrency: int = 8, load_runs: int = 48, repeats: int = 2, max_turns: int = 4,
                       seed: int = 0, json_path: str | None = None) -> dict[str, Any]:
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from ssr_server.api.app import build_tools
    from ssr_server.core.config import Settings
    from ssr_server.engine.factory import build_engine

    settings = Settings(model=model)
    engine = build_engine(settings)
    tools = build_tools(settings)
    reads: dict[str, Any] = {}
    fill_s, size = 0.0, 0
    try:
        if runs:
            with tempfile.TemporaryDirectory(prefix="ssr-bench-runs-") as tmp:
                url = f"sqlite:///{Path(tmp) / 'runs.sqlite3'}"
                t0 = time.perf_counter()
                ids = asyncio.run(_fill(url, runs, seed))
                fill_s = time.perf_counter() - t0
                size = (Path(tmp) / "runs.sqlite3").stat().st_size
                _say(f"filled {runs} runs in {fill_s:.1f} s ({size / 1e6:.0f} MB); timing reads")
                reads = _reads(engine, tools, url, ids, samples, seed)
        cost = _cost(engine, tools, concurrency, load_runs, repeats, max_turns, seed) if load_runs else None
    finally:
        asyncio.run(tools.aclose())
        asyncio.run(engine.close())
    out = {"bench": "runstore", "backend": "sqlite", "stored_runs": runs, "fill_s": fill_s,
           "db_bytes": size, "reads": reads, "read_floor_ms": READ_FLOOR_S * 1e3,
           "read_floor_met": (all(r["p95_ms"] <= READ_FLOOR_S * 1e3 for r in reads.values())
                              if reads else None),
           "cost": cost, "cost_floor": COST_FLOOR,
           "cost_floor_met": None if cost is None else cost["latency_ratio"] <= COST_FLOOR,
           "cpu_count": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]}
    if json_path:
        write_json(json_path, out)
    return out


def _say(text: str) -> None:
    print(f"[bench runstore] {text}", file=sys.stderr, flush=True)


def format_runstore(r: dict[str, Any]) -> str:
    lines = [f"run store bench: {r['cpu_count']} CPUs, load average {r['load_avg_1m']:.1f}"]
    if r["reads"]:
        lines += [f"{r['stored_runs']} stored runs on SQLite ({r['db_bytes'] / 1e6:.0f} MB)",
                  f"{'read':<18} {'p50 ms':>8} {'p95 ms':>8} {'n':>5}"]
        for k, v in r["reads"].items():
            lines.append(f"{k:<18} {v['p50_ms']:>8.1f} {v['p95_ms']:>8.1f} {v['n']:>5}")
        met = "met" if r["read_floor_met"] else "NOT met"
        lines.append(f"floor: every p95 <= {r['read_floor_ms']:.0f} ms: {met}")
    c = r.get("cost")
    if c:
        lines.append(f"store on vs off: {c['runs']} ssr runs x {c['repeats']} repeats at concurrency "
                     f"{c['concurrency']}, max_turns {c['max_turns']}")
        lines.append(f"{'store':<8} {'pair':>4} {'runs/s':>7} {'lat mean s':>10} {'p50 s':>7} {'p95 s':>7} "
                     f"{'cpu ms/run':>10}")
        for k, rows in c["samples"].items():
            for i, m in enumerate(rows):
                lines.append(f"{k:<8} {i + 1:>4} {m['runs_per_s']:>7.2f} {m['latency_mean_s']:>10.3f} "
                             f"{m['latency_p50_s']:>7.3f} {m['latency_p95_s']:>7.3f} "
                             f"{m['cpu_ms_per_run']:>10.1f}")
        met = "met" if r["cost_floor_met"] else "NOT met"
        lo, hi = c["latency_ratio_interval"]
        lines.append(f"on/off, median of the pairs: latency {c['latency_ratio']:.3f} (90% bootstrap interval "
                     f"{lo:.3f}-{hi:.3f}; all passes pooled {c['latency_ratio_pooled']:.3f}), throughput "
                     f"{c['throughput_ratio']:.3f}, model time per run {c['model_ratio']:.3f}, CPU per run "
                     f"{c['cpu_ratio']:.3f}; floor latency ratio <= {r['cost_floor']:.2f}: {met}")
    return "\n".join(lines)

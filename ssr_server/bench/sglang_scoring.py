"""``ssr-server bench scoring --engine sglang``: the SSR scoring paths of a running SGLang server.

Side by side, on one context (~700 tokens, an image for a VL model) and the default six rationales:
- naive: one /generate per candidate row (context + candidate), the radix cache flushed before each
  row, so every row recomputes the context (what a scorer without prefix sharing pays);
- route: our /ssr/score (context once, then the K rows on the cached context), cold and warm;
- two-step: the same over plain /generate (what the client does behind SGLang's router), cold and warm;
- freeform: 128 greedy tokens from the same context (EOS ignored), the baseline.
SGLang's /flush_cache empties the radix cache between the cold measurements (``SGLangEngine.flush_cache``
waits until SGLang is idle: it refuses to flush while a request still counts as running).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ssr_server.bench.report import write_json
from ssr_server.core.protocol import CandidateScore, Context, GenerationParams
from ssr_server.engine.sglang.client import SGLangEngine

T = TypeVar("T")


async def _timed(fn: Callable[[], Awaitable[T]]) -> tuple[float, T]:
    t0 = time.perf_counter()
    out = await fn()
    return (time.perf_counter() - t0) * 1e3, out


async def _naive(engine: SGLangEngine, ctx: Context, cands: list[list[int]]) -> list[CandidateScore]:
    out: list[CandidateScore] = []
    for cand in cands:
        await engine.flush_cache()
        out += await engine.score(ctx, [cand])
    return out


def _diff(a: list[CandidateScore], b: list[CandidateScore]) -> float:
    return max(abs(x - y) for u, v in zip(a, b, strict=True)
               for x, y in zip(u.token_logprobs, v.token_logprobs, strict=True))


async def run(url: str, model_dir: str, repeats: int, freeform_tokens: int = 128) -> dict[str, Any]:
    from ssr_server.bench.scoring import bench_context, default_candidates
    from ssr_server.engine.torch.loader import load_model

    lm = load_model(model_dir)  # tokenizer and image processor, to build the same context as the torch bench
    cands = default_candidates(lm)
    ctx = bench_context(lm, cands)
    route = SGLangEngine(url, model=model_dir, scoring="route")
    two = SGLangEngine(url, model=model_dir, scoring="generate")
    times: dict[str, list[float]] = {k: [] for k in (
        "naive", "route_cold", "route_warm", "two_step_cold", "two_step_warm", "freeform")}
    diffs: list[float] = []
    try:
        await route.score(ctx, cands)  # warm-up (first image request is slow)
        for _ in range(repeats):
            ms, naive = await _timed(lambda: _naive(two, ctx, cands))
            times["naive"].append(ms)
            for name, eng in (("route", route), ("two_step", two)):
                await eng.flush_cache()
                ms, cold = await _timed(lambda eng=eng: eng.score(ctx, cands))  # type: ignore[misc]
                times[f"{name}_cold"].append(ms)
                ms, warm = await _timed(lambda eng=eng: eng.score(ctx, cands))  # type: ignore[misc]
                times[f"{name}_warm"].append(ms)
                diffs += [_diff(cold, naive), _diff(warm, naive)]
            ms, _ = await _timed(lambda: route.generate(ctx, GenerationParams(
                max_new_tokens=freeform_tokens, ignore_eos=True)))
            times["freeform"].append(ms)
    finally:
        await route.close()
        await two.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    per_token = med["freeform"] / freeform_tokens
    return {
        "engine": "sglang", "url": url, "model": model_dir, "repeats": repeats,
        "context_tokens": len(ctx), "candidate_tokens": [len(c) for c in cands],
        **{f"{k}_ms": v for k, v in med.items()},
        "freeform_tokens": freeform_tokens, "decode_ms_per_token": per_token,
        "route_warm_over_naive": med["route_warm"] / med["naive"],
        "route_warm_over_freeform": med["route_warm"] / med["freeform"],
        "scoring_cost_decode_steps": med["route_warm"] / per_token,
        "max_abs_diff": max(diffs), "runs_ms": times,
    }


def run_sglang_scoring_bench(url: str, model_dir: str, repeats: int = 3,
                             json_path: str | None = None) -> dict[str, Any]:
    result = asyncio.run(run(url, model_dir, repeats))
    if json_path:
        write_json(json_path, result)
    return result


def format_table(r: dict[str, Any]) -> str:
    rows = [("naive (row per candidate, no cache)", "naive_ms"), ("/ssr/score, cold cache", "route_cold_ms"),
            ("/ssr/score, cached context", "route_warm_ms"), ("two-step /generate, cold", "two_step_cold_ms"),
            ("two-step /generate, cached context", "two_step_warm_ms"),
            (f"freeform, {r['freeform_tokens']} tokens", "freeform_ms")]
    lines = [f"sglang scoring bench - {r['model']} at {r['url']}, median of {r['repeats']}",
             f"context: {r['context_tokens']} compact tokens; candidates {r['candidate_tokens']}", "",
             f"{'method':<40}{'ms':>10}"]
    lines += [f"{name:<40}{r[key]:>10.1f}" for name, key in rows]
    lines += ["", f"route(cached)/naive = {r['route_warm_over_naive']:.3f}   route(cached)/freeform = "
              f"{r['route_warm_over_freeform']:.3f}   scoring = "
              f"{r['scoring_cost_decode_steps']:.1f} decode steps   "
              f"max |diff| vs naive = {r['max_abs_diff']:.2e}"]
    return "\n".join(lines)

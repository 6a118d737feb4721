"""Per-turn SSR vs freeform reasoning latency on an agent context that grows like a run."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ssr_server.bench.gpu_check.common import (
    CACHE_REUSE_FLOOR,
    DEFAULT_TURNS,
    DEFAULT_WARMUP,
    EXIT_FAILED,
    FREEFORM_ENTITY,
    FREEFORM_TOKENS,
    IMAGE_SIZE,
    QUESTION,
    SSR_ENTITY,
    WARMUP_ENTITY,
    CheckError,
)

# ---------------------------------------------------------------------------------------------- measure


@dataclass
class TurnRecord:
    turn: int
    compact_tokens: int  # len(context): one pad token per image
    context_tokens: int  # as the engine counts it (image expanded)
    ssr_ms: float
    freeform_ms: float
    selected: int
    ssr_cached_tokens: int  # the candidates' rows (min over rows)
    freeform_cached_tokens: int
    freeform_prompt_tokens: int
    ssr_first: bool


@dataclass
class Measurement:
    turns: list[TurnRecord] = field(default_factory=list)
    candidate_tokens: list[int] = field(default_factory=list)
    last_context: Any = None  # the last SSR turn's context (cached by the engine): for correctness checks
    candidates: list[list[int]] = field(default_factory=list)
    freeform_tokens: int = FREEFORM_TOKENS
    image_size: tuple[int, int] = IMAGE_SIZE
    warmup: int = DEFAULT_WARMUP


def _observation_text(turn: int, k: int = 5) -> tuple[str, str]:
    """A text_search query and its results as TextSearchTool shows them (numbered hits from the demo
    corpus; written out here so that the check does not need the search backend's dependencies)."""
    from ssr_server.tools.demo import shipped_demo_world

    docs = shipped_demo_world().documents()
    hits = [docs[(turn * k + i) % len(docs)] for i in range(k)]
    query = f"{hits[0]['title']} height"
    lines = [f"\n[{i}] {h['title']}: {h['text']} ({h['url']})" for i, h in enumerate(hits, start=1)]
    return query, f'Results for "{query}":' + "".join(lines)


async def measure(engine: Any, *, turns: int = DEFAULT_TURNS, warmup: int = DEFAULT_WARMUP,
                  freeform_tokens: int = FREEFORM_TOKENS, image_size: tuple[int, int] = IMAGE_SIZE,
                  log: Callable[[str], None] | None = None) -> Measurement:
    """Run ``warmup`` untimed and ``turns`` timed turns of SSR and freeform reasoning on ``engine``."""
    from ssr_server.agent.chat import ChatRenderer
    from ssr_server.core.formats.format import get_format
    from ssr_server.core.library import LibraryRegistry
    from ssr_server.core.protocol import Context, GenerationParams, ImageRef
    from ssr_server.core.selection import select
    from ssr_server.tools.demo import demo_picture

    fmt = get_format()
    chat = ChatRenderer(engine.tokenizer, fmt)
    library = LibraryRegistry().get("default")
    cands = [list(c) for c in library.candidate_token_ids(engine.tokenizer, fmt.candidate_surfaces(library))]
    params = GenerationParams(max_new_tokens=freeform_tokens, temperature=0.0, ignore_eos=True)

    def start(entity: str) -> Context:
        return chat.start(QUESTION, [ImageRef.from_pil(demo_picture(entity).resize(image_size))], library)

    def grow(ctx: Context, turn: int, selected: int) -> Context:
        query, text = _observation_text(turn)
        action = chat.encode(fmt.tool_call_text("text_search", {"query": query}))
        return ctx.extend(list(cands[selected]) + list(action) + list(chat.observation(text, (), 1)))

    async def ssr(ctx: Context) -> tuple[float, int, Any]:
        t0 = time.perf_counter()
        scores = await engine.score(ctx, cands)
        sel = select([s.logprob_sum for s in scores], [s.num_tokens for s in scores], tau=0.0)
        return (time.perf_counter() - t0) * 1e3, sel.index, scores

    async def freeform(ctx: Context) -> tuple[float, Any]:
        t0 = time.perf_counter()
        gen = await engine.generate(ctx, params)
        ms = (time.perf_counter() - t0) * 1e3
        if len(gen.token_ids) != freeform_tokens:
            raise CheckError(EXIT_FAILED, f"freeform decoded {len(gen.token_ids)} tokens, not "
                                          f"{freeform_tokens} (ignore_eos not honoured?)")
        return ms, gen

    result = Measurement(candidate_tokens=[len(c) for c in cands], freeform_tokens=freeform_tokens,
                         image_size=image_size, warmup=warmup)
    warm = start(WARMUP_ENTITY)
    for i in range(warmup):
        _, selected, _ = await ssr(warm)
        await freeform(warm)
        warm = grow(warm, i, selected)
    if log:
        log(f"  warm-up done ({warmup} turns)")

    ctx_ssr, ctx_free = start(SSR_ENTITY), start(FREEFORM_ENTITY)
    for t in range(turns):
        ssr_first = t % 2 == 0
        if ssr_first:
            ssr_ms, selected, scores = await ssr(ctx_ssr)
            free_ms, gen = await freeform(ctx_free)
        else:
            free_ms, gen = await freeform(ctx_free)
            ssr_ms, selected, scores = await ssr(ctx_ssr)
        rec = TurnRecord(
            turn=t, compact_tokens=len(ctx_ssr), context_tokens=int(scores[0].context_tokens),
            ssr_ms=ssr_ms, freeform_ms=free_ms, selected=selected,
            ssr_cached_tokens=min(int(s.cached_tokens) for s in scores),
            freeform_cached_tokens=int(gen.cached_tokens), freeform_prompt_tokens=int(gen.prompt_tokens),
            ssr_first=ssr_first)
        result.turns.append(rec)
        if log:
            log(f"  turn {t:>2}: context {rec.context_tokens:>5} tokens  ssr {ssr_ms:8.1f} ms  "
                f"freeform {free_ms:8.1f} ms")
        result.last_context = ctx_ssr
        # Both contexts grow by the same tokens (SSR's selection), so their lengths stay equal.
        ctx_ssr, ctx_free = grow(ctx_ssr, t, selected), grow(ctx_free, t, selected)
    result.candidates = cands
    return result


def _p95(xs: Sequence[float]) -> float:
    """The 95th percentile, linear interpolation between closest ranks (numpy's default)."""
    s = sorted(xs)
    if len(s) == 1:
        return float(s[0])
    pos = 0.95 * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return float(s[lo] + (s[hi] - s[lo]) * (pos - lo))


def _stats(xs: Sequence[float]) -> dict[str, float]:
    return {"mean_ms": float(statistics.fmean(xs)), "p50_ms": float(statistics.median(xs)),
            "p95_ms": _p95(xs), "min_ms": float(min(xs)), "max_ms": float(max(xs))}


def summarize(m: Measurement) -> dict[str, Any]:
    """The figures of one shape from its turn records."""
    if not m.turns:
        raise CheckError(EXIT_FAILED, "no turns were measured")
    ssr = _stats([r.ssr_ms for r in m.turns])
    free = _stats([r.freeform_ms for r in m.turns])
    decode_ms = free["mean_ms"] / m.freeform_tokens
    # Prefix-cache reuse: from turn 1 on, a call should find (almost all of) the previous turn's context
    # cached. For SGLang's route, a row's cached_tokens counts the context cached by the route's first
    # call; for the embedded engine it counts the prefix found before the prefill.
    pairs = list(zip(m.turns[:-1], m.turns[1:], strict=True))
    reuse_ssr = [min(1.0, r.ssr_cached_tokens / max(1, p.context_tokens)) for p, r in pairs]
    reuse_free = [min(1.0, r.freeform_cached_tokens / max(1, p.freeform_prompt_tokens)) for p, r in pairs]
    cache = {
        "ssr_min_reuse": min(reuse_ssr, default=None),
        "freeform_min_reuse": min(reuse_free, default=None),
        "floor": CACHE_REUSE_FLOOR,
    }
    cache["ok"] = bool(reuse_ssr and reuse_free and min(reuse_ssr) >= CACHE_REUSE_FLOOR
                       and min(reuse_free) >= CACHE_REUSE_FLOOR)
    return {
        "ssr": ssr, "freeform": free,
        "reduction_pct": 100.0 * (1.0 - ssr["mean_ms"] / free["mean_ms"]),
        "p95_reduction_pct": 100.0 * (1.0 - ssr["p95_ms"] / free["p95_ms"]),
        "decode_ms_per_token": decode_ms,
        "scoring_cost_decode_steps": ssr["mean_ms"] / decode_ms,
        "freeform_tokens": m.freeform_tokens,
        "context_tokens_first": m.turns[0].context_tokens,
        "context_tokens_last": m.turns[-1].context_tokens,
        "candidate_tokens": m.candidate_tokens,
        "image_size": list(m.image_size),
        "turns": len(m.turns), "warmup": m.warmup,
        "cache": cache,
        "per_turn": [asdict(r) for r in m.turns],
    }

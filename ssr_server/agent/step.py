"""The one selection step: score every candidate on the context, build q, pick, count.

The agent loop, ``POST /v1/ssr/select`` and the OpenAI route all select through ``select_step``, so a
rationale is chosen, timed and counted the same way wherever it is chosen.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ssr_server.core import metrics, tracing
from ssr_server.core.library import Candidate, Library
from ssr_server.core.protocol import CandidateScore, Context, Engine
from ssr_server.core.selection import Selection, select


@dataclass(frozen=True)
class StepResult:
    selection: Selection
    scores: list[CandidateScore]  # per candidate, library order
    latency_s: float  # scoring + selection: the turn's reasoning time in SSR mode
    candidate: Candidate

    @property
    def scored_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scores)


async def select_step(engine: Engine, ctx: Context, library: Library, candidate_ids: Sequence[Sequence[int]],
                      *, alpha: float, tau: float, seed: int | np.random.Generator | None) -> StepResult:
    """Score ``candidate_ids`` (the library's surfaces, tokenised) on ``ctx`` and select one."""
    with tracing.span("ssr.select", {"ssr.library": library.name}) as span:
        t0 = time.perf_counter()
        scores = await engine.score(ctx, candidate_ids)
        sel = select([s.logprob_sum for s in scores], [s.num_tokens for s in scores], alpha=alpha, tau=tau,
                     seed=seed)
        latency = time.perf_counter() - t0
        cand = library.candidates[sel.index]
        span.set({"ssr.select.candidates": len(scores), "ssr.select.chosen": cand.id,
                  "ssr.select.score": float(sel.scores[sel.index]), "ssr.select.q": float(sel.q[sel.index]),
                  "ssr.select.max_q": float(max(sel.q)),
                  "ssr.scored_tokens": sum(s.num_tokens for s in scores),
                  "ssr.cached_tokens": scores[0].cached_tokens if scores else 0})
    metrics.CANDIDATE_SELECTED.labels(library=library.name, candidate=cand.id).inc()
    metrics.SCORED_TOKENS.inc(sum(s.num_tokens for s in scores))
    return StepResult(selection=sel, scores=list(scores), latency_s=latency, candidate=cand)

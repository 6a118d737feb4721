"""The one two-step SGLang scorer, used by our ``/ssr/score`` route (inside SGLang's process) and by the
client behind SGLang's router (over plain ``/generate``).

1. The context alone with ``max_new_tokens`` 0: the radix cache then holds it, and SGLang reports its
   length as it sees it (images expanded), P.
2. The K rows context + candidate in one batch with ``logprob_start_len = P - 1``: every row reuses the
   cached context (``cached_tokens >= P - 1``) and returns the log-probabilities of the last context
   token (None) and of each candidate token, which are checked against the candidate's ids.

Pure Python (no SGLang, no torch): ``generate`` is whatever sends one ``/generate`` payload.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

Generate = Callable[[dict[str, Any]], Awaitable[Any]]


class TwoStepError(Exception):
    """SGLang's answer failed a check (wrong tokens, non-finite values, wrong row count)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class TwoStepScores:
    token_logprobs: list[list[float]]  # per candidate
    cached_tokens: list[int]  # per candidate row, as SGLang reports
    context_tokens: int  # P, the expanded context length
    context_cached_tokens: int  # context tokens already cached when step 1 came
    timings: dict[str, float] = field(default_factory=dict)


def check_row(entries: Sequence[Sequence[Any]], candidate: Sequence[int], row: int) -> list[float]:
    """The candidate's log-probabilities from one row's ``input_token_logprobs`` (which starts at the
    last context token); ``TwoStepError`` if SGLang answered for other tokens or non-finite values."""
    if len(entries) != len(candidate) + 1:
        raise TwoStepError(f"row {row}: SGLang returned {len(entries)} prompt logprobs, expected "
                           f"{len(candidate) + 1} (last context token + candidate)")
    got = [int(e[1]) for e in entries[1:]]
    if got != list(candidate):
        raise TwoStepError(f"row {row}: token ids {got} != candidate {list(candidate)}")
    out: list[float] = []
    for j, e in enumerate(entries[1:]):
        v = e[0]
        if v is None or not math.isfinite(float(v)):
            raise TwoStepError(f"row {row}: logprob of token {j} is {v!r}")
        out.append(float(v))
    return out


def _outputs(result: Any) -> list[dict[str, Any]]:
    return result if isinstance(result, list) else [result]


async def score_two_step(generate: Generate, input_ids: Sequence[int], image_data: Sequence[str],
                         candidates: Sequence[Sequence[int]]) -> TwoStepScores:
    """Score ``candidates`` on the context ``input_ids`` (compact: one image pad per ``image_data``)."""
    t0 = time.perf_counter()
    ids = list(input_ids)
    first: dict[str, Any] = {"input_ids": ids, "sampling_params": {"max_new_tokens": 0}}
    if image_data:
        first["image_data"] = list(image_data)
    head = _outputs(await generate(first))[0]
    meta = head.get("meta_info", {})
    p = int(meta["prompt_tokens"])
    t1 = time.perf_counter()
    k = len(candidates)
    batch: dict[str, Any] = {
        "input_ids": [ids + list(c) for c in candidates], "sampling_params": {"max_new_tokens": 0},
        "return_logprob": True, "logprob_start_len": p - 1,
    }
    if image_data:
        batch["image_data"] = [list(image_data) for _ in range(k)]
    rows = _outputs(await generate(batch))
    t2 = time.perf_counter()
    if len(rows) != k:
        raise TwoStepError(f"SGLang returned {len(rows)} rows for {k} candidates")
    logprobs, cached = [], []
    for i, (row, cand) in enumerate(zip(rows, candidates, strict=True)):
        m = row.get("meta_info", {})
        logprobs.append(check_row(m.get("input_token_logprobs") or [], cand, i))
        cached.append(int(m.get("cached_tokens", 0)))
    return TwoStepScores(logprobs, cached, p, int(meta.get("cached_tokens", 0)),
                         {"context_s": t1 - t0, "score_s": t2 - t1})

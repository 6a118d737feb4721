"""Percentile summaries, computed one way for the load test, batch inference and the eval report."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


def percentiles(values: Sequence[float] | Iterable[float], qs: Sequence[int] = (50, 95, 99),
                ) -> dict[str, float | None]:
    """``{"p50": ..., "p95": ..., "p99": ..., "mean", "max", "n"}``; None entries when there is no data."""
    arr = np.asarray(list(values), dtype=float)
    out: dict[str, float | None] = {}
    if arr.size == 0:
        out.update({f"p{q}": None for q in qs})
        out.update(mean=None, max=None, n=0)
        return out
    for q, v in zip(qs, np.percentile(arr, list(qs)), strict=True):
        out[f"p{q}"] = float(v)
    out.update(mean=float(arr.mean()), max=float(arr.max()), n=int(arr.size))
    return out


def forwards_line(actions: int, tokens: int, forwards: int) -> str:
    """Decode forwards per action and tokens per forward (written once: infer and the lab's eval)."""
    if not actions:
        return "none"
    per = f"{tokens / forwards:.2f} tokens per forward" if forwards else "forwards not reported"
    return f"{forwards / actions:.1f} decode forwards per action, {tokens / actions:.1f} tokens, {per}"

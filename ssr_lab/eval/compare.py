"""How sure is a success figure, and is one model really better than another on the same questions?

A 240-question eval has a 95% interval about +-5.5 points wide at 76%; the training log's rows are
often a few points apart, so a difference read off two tables is mostly noise. Two evals of the same
questions are *paired*: what decides is the questions one model gets right and the other wrong
(the discordant pairs), not the two rates. This module gives:

- ``wilson``: the Wilson score interval of one success rate (good at small n and near 0 or 1);
- ``compare``: per question kind and overall, on the questions both evals share: the two rates, the
  difference B - A with a paired bootstrap 95% interval (resampling questions, not runs of each model
  separately), and the exact McNemar test's two-sided p-value on the discordant pairs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ssr_lab.world.records import KINDS
from ssr_server.core.errors import InvalidRequest

__all__ = ["Paired", "compare", "format_comparison", "mcnemar_exact", "paired_bootstrap", "wilson"]

Z95 = 1.959963984540054
BOOTSTRAP_SAMPLES = 10_000


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval for ``successes`` out of ``n`` (``(0, 1)`` when ``n`` is 0)."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value: under "no difference" each discordant pair is a fair coin."""
    m = only_a + only_b
    if m == 0:
        return 1.0
    k = min(only_a, only_b)
    tail = sum(math.comb(m, i) for i in range(k + 1)) / 2.0**m
    return min(1.0, 2 * tail)


def paired_bootstrap(only_a: int, only_b: int, n: int, samples: int = BOOTSTRAP_SAMPLES,
                     seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of the paired difference (B - A) in success rate over ``n`` questions.

    Resampling n questions with replacement only matters through how many of each kind of pair are
    drawn (B right only, A right only, the rest), so one multinomial draw per resample gives exactly
    the resampling distribution without materialising ``samples x n`` indices."""
    if n <= 0:
        return 0.0, 0.0
    probs = [only_b / n, only_a / n, (n - only_a - only_b) / n]
    counts = np.random.default_rng(seed).multinomial(n, probs, size=samples)  # (samples, 3)
    diffs = (counts[:, 0] - counts[:, 1]) / n
    low, high = np.quantile(diffs, [0.025, 0.975])
    return float(low), float(high)


@dataclass(frozen=True)
class Paired:
    """One group's paired outcome: ``both`` right, ``only_a`` (A right, B wrong), ``only_b``, ``neither``."""

    group: str
    both: int
    only_a: int
    only_b: int
    neither: int

    @property
    def n(self) -> int:
        return self.both + self.only_a + self.only_b + self.neither

    @property
    def success_a(self) -> float:
        return (self.both + self.only_a) / self.n if self.n else 0.0

    @property
    def success_b(self) -> float:
        return (self.both + self.only_b) / self.n if self.n else 0.0

    @property
    def diff(self) -> float:
        return self.success_b - self.success_a

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group, "questions": self.n, "both": self.both, "only_a": self.only_a,
            "only_b": self.only_b, "neither": self.neither,
            "success_a": self.success_a, "success_a_ci95": wilson(self.both + self.only_a, self.n),
            "success_b": self.success_b, "success_b_ci95": wilson(self.both + self.only_b, self.n),
            "diff": self.diff, "diff_ci95": paired_bootstrap(self.only_a, self.only_b, self.n),
            "mcnemar_p": mcnemar_exact(self.only_a, self.only_b),
        }


def _pair(group: str, a: Sequence[bool], b: Sequence[bool]) -> Paired:
    both = sum(x and y for x, y in zip(a, b, strict=True))
    only_a = sum(x and not y for x, y in zip(a, b, strict=True))
    only_b = sum(y and not x for x, y in zip(a, b, strict=True))
    return Paired(group, both, only_a, only_b, len(a) - both - only_a - only_b)


def compare(eval_a: Mapping[str, Any], eval_b: Mapping[str, Any]) -> dict[str, Any]:
    """Two eval JSONs (as ``ssr-lab eval --json`` writes them) compared on the questions they share."""
    recs_a = {r["id"]: r for r in eval_a.get("records", [])}
    recs_b = {r["id"]: r for r in eval_b.get("records", [])}
    shared = [qid for qid in recs_a if qid in recs_b]
    if not shared:
        raise InvalidRequest("the two evals share no question: compare evals of the same split and world")
    kinds = sorted({recs_a[q]["kind"] for q in shared}, key=lambda k: (*KINDS, k).index(k))
    groups = [*((k, [q for q in shared if recs_a[q]["kind"] == k]) for k in kinds), ("overall", shared)]
    if all("heldout" in recs_a[q] for q in shared):
        groups += [(name, [q for q in shared if bool(recs_a[q]["heldout"]) == held])
                   for name, held in (("seen", False), ("held-out", True))]
    rows = [_pair(name, [bool(recs_a[q]["correct"]) for q in ids], [bool(recs_b[q]["correct"]) for q in ids])
            for name, ids in groups if ids]
    def about(data: Mapping[str, Any], recs: Mapping[str, Any]) -> dict[str, Any]:
        settings = data.get("settings", {})
        return {"questions": len(recs), **{k: settings.get(k) for k in ("model", "mode", "split")}}

    return {
        "a": about(eval_a, recs_a), "b": about(eval_b, recs_b),
        "shared": len(shared), "groups": [row.to_dict() for row in rows],
    }


def _pts(x: float) -> str:
    return f"{100 * x:+.1f}"


def _rate(x: float, ci: Sequence[float]) -> str:
    return f"{100 * x:.1f} [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def format_comparison(result: Mapping[str, Any], name_a: str = "A", name_b: str = "B") -> str:
    a, b = result["a"], result["b"]
    lines = [f"A = {name_a} ({a['model']}, {a['mode']}, {a['split']}, {a['questions']} questions)",
             f"B = {name_b} ({b['model']}, {b['mode']}, {b['split']}, {b['questions']} questions)",
             f"compared on the {result['shared']} questions both answered; intervals are 95%",
             f"{'group':<10} {'n':>5} {'A success [Wilson]':>22} {'B success [Wilson]':>22} "
             f"{'B - A [paired bootstrap]':>26} {'only A':>7} {'only B':>7} {'McNemar p':>10}"]
    for g in result["groups"]:
        sa, sb = (_rate(g[f"success_{x}"], g[f"success_{x}_ci95"]) for x in ("a", "b"))
        d = f"{_pts(g['diff'])} [{_pts(g['diff_ci95'][0])}, {_pts(g['diff_ci95'][1])}]"
        lines.append(f"{g['group']:<10} {g['questions']:>5} {sa:>22} {sb:>22} {d:>26} {g['only_a']:>7} "
                     f"{g['only_b']:>7} {g['mcnemar_p']:>10.3f}")
    return "\n".join(lines)

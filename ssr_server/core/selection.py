"""Selection math for SSR: length-normalised scores, the selection distribution, and the pick.

For candidate ``i`` with ``K_i`` tokens whose teacher-forced log-probabilities sum to ``L_i``::

    S_i = K_i ** -alpha * L_i        (alpha = 1: mean token log-prob; alpha = 0: raw sum)
    q   = softmax(S / tau)           (tau = 0: one-hot at the argmax, lowest index on ties)

``tau = 0`` picks the argmax deterministically; ``tau > 0`` samples an index from ``q`` with a numpy
``Generator`` (seeded for reproducibility). Everything here is pure and torch-free; bad input raises
``InvalidRequest``. ``length_normalised`` is the one place the score formula is written: serving calls
it on numpy arrays here, training on torch tensors (``ssr_lab.train``), so what is trained is exactly
what is served. ``DEFAULT_TAU`` and ``DEFAULT_ALPHA`` are the defaults of every entrance (HTTP, CLI,
run options).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

import numpy as np
import numpy.typing as npt

from ssr_server.core.errors import InvalidRequest

__all__ = ["DEFAULT_ALPHA", "DEFAULT_TAU", "Selection", "length_normalised",
           "normalised_scores", "select", "softmax_q"]

FloatArray = npt.NDArray[np.float64]

DEFAULT_TAU = 0.0  # argmax: a run is deterministic unless the caller asks for sampling
DEFAULT_ALPHA = 1.0  # the mean token log-probability: long and short rationales compete evenly


class _Divisible(Protocol):
    def __truediv__(self, other: Any, /) -> Any: ...


ScoreT = TypeVar("ScoreT", bound=_Divisible)


def length_normalised(logprob_sum: ScoreT, num_tokens: Any, alpha: float) -> ScoreT:
    """``S = K ** -alpha * sum(logp)``: floats, numpy arrays or torch tensors (gradient kept)."""
    return cast(ScoreT, logprob_sum / num_tokens**alpha)


@dataclass(frozen=True)
class Selection:
    index: int  # the chosen candidate (0-based)
    scores: tuple[float, ...]  # S, one per candidate
    q: tuple[float, ...]  # the selection distribution, sums to 1

    @property
    def probability(self) -> float:
        """q of the chosen candidate."""
        return self.q[self.index]


# --------------------------------------------------------------------------------------------------
# Validation helpers
# --------------------------------------------------------------------------------------------------


def _finite_vector(values: Sequence[float], what: str) -> FloatArray:
    if isinstance(values, str | bytes):
        raise InvalidRequest(f"{what}: expected a list of numbers")
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidRequest(f"{what}: expected a list of numbers") from None
    if arr.ndim != 1:
        raise InvalidRequest(f"{what}: expected a flat list of numbers")
    if arr.size == 0:
        raise InvalidRequest(f"{what}: must not be empty")
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise InvalidRequest(f"{what}[{int(bad[0])}] is not finite ({arr[bad[0]]})")
    return arr


def _counts_vector(token_counts: Sequence[int]) -> FloatArray:
    if isinstance(token_counts, str | bytes):
        raise InvalidRequest("token_counts: expected a list of integers")
    counts: list[int] = []
    for i, k in enumerate(token_counts):
        if isinstance(k, bool) or not isinstance(k, numbers.Integral):
            raise InvalidRequest(f"token_counts[{i}] must be an integer, got {k!r}")
        if int(k) < 1:
            raise InvalidRequest(f"token_counts[{i}] must be >= 1, got {int(k)}")
        counts.append(int(k))
    if not counts:
        raise InvalidRequest("token_counts: must not be empty")
    return np.asarray(counts, dtype=np.float64)


def _non_negative(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidRequest(f"{what} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < 0:
        raise InvalidRequest(f"{what} must be finite and >= 0, got {value!r}")
    return v


# --------------------------------------------------------------------------------------------------
# Math
# --------------------------------------------------------------------------------------------------


def _scores(sums: FloatArray, counts: FloatArray, alpha: float) -> FloatArray:
    if sums.shape != counts.shape:
        raise InvalidRequest(f"logprob_sums and token_counts differ in length ({sums.size} != {counts.size})")
    if alpha == 0.0:
        return sums.copy()
    with np.errstate(over="ignore", under="ignore"):
        return length_normalised(sums, counts, alpha)


def _softmax(scores: FloatArray, tau: float) -> FloatArray:
    n = scores.size
    if tau == 0.0:
        q = np.zeros(n, dtype=np.float64)
        q[int(np.argmax(scores))] = 1.0  # np.argmax returns the first maximum: lowest index on ties
        return q
    # Subtract the max first: every exponent is <= 0, so nothing overflows; a tiny tau sends
    # non-maximal entries to -inf (exp -> 0) without producing NaN.
    with np.errstate(over="ignore", under="ignore", divide="ignore"):
        z = (scores - scores.max()) / tau
        e = np.exp(z)
    total = float(e.sum())  # >= 1: the maximum contributes exp(0)
    out: FloatArray = e / total
    return out


def normalised_scores(
    logprob_sums: Sequence[float], token_counts: Sequence[int], alpha: float = DEFAULT_ALPHA
) -> list[float]:
    """``S_i = K_i ** -alpha * logprob_sums[i]``."""
    sums = _finite_vector(logprob_sums, "logprob_sums")
    counts = _counts_vector(token_counts)
    a = _non_negative(alpha, "alpha")
    return [float(s) for s in _scores(sums, counts, a)]


def softmax_q(scores: Sequence[float], tau: float) -> list[float]:
    """``softmax(scores / tau)``; ``tau = 0`` gives a one-hot at the argmax (lowest index on ties)."""
    s = _finite_vector(scores, "scores")
    t = _non_negative(tau, "tau")
    return [float(x) for x in _softmax(s, t)]


def _rng(seed: int | np.random.Generator | None) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is None:
        return np.random.default_rng()
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or int(seed) < 0:
        raise InvalidRequest(f"seed must be a non-negative integer, got {seed!r}")
    return np.random.default_rng(int(seed))


def _sample(q: FloatArray, rng: np.random.Generator) -> int:
    cdf = np.cumsum(q)
    u = float(rng.random()) * float(cdf[-1])
    index = int(np.searchsorted(cdf, u, side="right"))  # first i with cdf[i] > u: never a q_i = 0
    if index >= q.size:  # only through rounding at the top end
        index = int(np.flatnonzero(q > 0)[-1])
    return index


def select(
    logprob_sums: Sequence[float],
    token_counts: Sequence[int],
    alpha: float = DEFAULT_ALPHA,
    tau: float = DEFAULT_TAU,
    seed: int | np.random.Generator | None = None,
) -> Selection:
    """Score, build ``q``, and pick: the argmax when ``tau == 0``, else a draw from ``q``.

    ``seed`` is an integer (a fresh generator seeded with it: reproducible), a numpy ``Generator``
    (used as is, advancing its state: for a run that draws once per turn), or ``None`` (unseeded).
    It is ignored when ``tau == 0``.
    """
    sums = _finite_vector(logprob_sums, "logprob_sums")
    counts = _counts_vector(token_counts)
    a = _non_negative(alpha, "alpha")
    t = _non_negative(tau, "tau")
    scores = _scores(sums, counts, a)
    if not np.all(np.isfinite(scores)):  # cannot happen for finite sums and counts >= 1
        raise InvalidRequest("scores are not finite")
    rng = _rng(seed)  # validated even when unused
    q = _softmax(scores, t)
    index = int(np.argmax(q)) if t == 0.0 else _sample(q, rng)
    return Selection(index=index, scores=tuple(float(s) for s in scores), q=tuple(float(x) for x in q))

"""Selection math: length normalisation, the softmax distribution, argmax ties, seeded sampling."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ssr_server.core.errors import InvalidRequest
from ssr_server.core.selection import Selection, normalised_scores, select, softmax_q

finite_logprobs = st.floats(min_value=-1e4, max_value=0.0, allow_nan=False, allow_infinity=False)
counts_st = st.integers(min_value=1, max_value=200)


@st.composite
def sums_and_counts(draw: st.DrawFn) -> tuple[list[float], list[int]]:
    n = draw(st.integers(min_value=1, max_value=16))
    sums = draw(st.lists(finite_logprobs, min_size=n, max_size=n))
    counts = draw(st.lists(counts_st, min_size=n, max_size=n))
    return sums, counts


# ------------------------------------------------------------------ normalised_scores


def test_length_normalisation_example() -> None:
    # A long candidate with a larger total but a better per-token log-prob wins after normalisation.
    sums = [-6.0, -10.0]
    counts = [3, 10]
    assert normalised_scores(sums, counts) == [-2.0, -1.0]
    assert select(sums, counts).index == 1
    assert select(sums, counts, alpha=0.0).index == 0  # raw sums prefer the short one


def test_alpha_zero_gives_raw_sums() -> None:
    sums = [-1.5, -20.25, -3.0]
    assert normalised_scores(sums, [1, 7, 30], alpha=0.0) == sums


def test_alpha_half() -> None:
    s = normalised_scores([-8.0], [4], alpha=0.5)
    assert s == pytest.approx([-4.0])


@given(sums_and_counts(), st.floats(min_value=0.0, max_value=3.0))
def test_scores_formula(data: tuple[list[float], list[int]], alpha: float) -> None:
    sums, counts = data
    got = normalised_scores(sums, counts, alpha=alpha)
    want = [s * k**-alpha for s, k in zip(sums, counts, strict=True)]
    assert got == pytest.approx(want, rel=1e-12, abs=1e-300)


# ------------------------------------------------------------------ softmax_q


def test_tau_zero_is_one_hot_at_argmax() -> None:
    assert softmax_q([-3.0, -1.0, -2.0], 0.0) == [0.0, 1.0, 0.0]


def test_tau_zero_ties_go_to_lowest_index() -> None:
    assert softmax_q([-1.0, -0.5, -0.5, -0.5], 0.0) == [0.0, 1.0, 0.0, 0.0]
    sel = select([-2.0, -1.0, -1.0], [2, 1, 1], tau=0.0)
    # all three normalise to -1.0: a three-way tie
    assert sel.scores == (-1.0, -1.0, -1.0)
    assert sel.index == 0
    assert sel.q == (1.0, 0.0, 0.0)


def test_softmax_known_values() -> None:
    q = softmax_q([0.0, math.log(3.0)], 1.0)
    assert q == pytest.approx([0.25, 0.75])
    # temperature halves the logit gap
    q2 = softmax_q([0.0, 2 * math.log(3.0)], 2.0)
    assert q2 == pytest.approx([0.25, 0.75])


def test_large_tau_is_near_uniform() -> None:
    q = softmax_q([-50.0, -1.0, -3.0, -0.1], 1e6)
    assert q == pytest.approx([0.25] * 4, abs=1e-4)


def test_tiny_tau_is_stable() -> None:
    q = softmax_q([-1.0, -1.0 - 1e-9, -5.0], 1e-300)
    assert all(math.isfinite(x) for x in q)
    assert q == [1.0, 0.0, 0.0]


def test_extreme_scores_are_stable() -> None:
    q = softmax_q([-1e300, 1e300, 0.0], 1.0)
    assert q == [0.0, 1.0, 0.0]


@given(st.lists(st.floats(min_value=-1e6, max_value=1e6), min_size=1, max_size=16), st.floats(0.0, 1e3))
def test_q_is_a_distribution(scores: list[float], tau: float) -> None:
    q = softmax_q(scores, tau)
    assert len(q) == len(scores)
    assert all(0.0 <= x <= 1.0 for x in q)
    assert math.fsum(q) == pytest.approx(1.0, abs=1e-9)
    # the argmax of the scores always carries the most mass
    best = max(range(len(scores)), key=lambda i: (scores[i], -i))
    assert q[best] == max(q)


@given(sums_and_counts(), st.floats(0.0, 3.0), st.floats(0.0, 10.0), st.integers(0, 2**32))
def test_select_is_consistent(
    data: tuple[list[float], list[int]], alpha: float, tau: float, seed: int
) -> None:
    sums, counts = data
    sel = select(sums, counts, alpha=alpha, tau=tau, seed=seed)
    assert isinstance(sel, Selection)
    assert sel.scores == tuple(normalised_scores(sums, counts, alpha))
    assert sel.q == tuple(softmax_q(list(sel.scores), tau))
    assert 0 <= sel.index < len(sums)
    assert sel.q[sel.index] > 0.0
    assert sel.probability == sel.q[sel.index]
    if tau == 0.0:
        assert sel.index == sel.scores.index(max(sel.scores))


# ------------------------------------------------------------------ sampling


def test_seeded_sampling_is_reproducible() -> None:
    sums, counts = [-3.0, -2.0, -2.5, -4.0], [3, 2, 5, 4]
    a = [select(sums, counts, tau=1.0, seed=s).index for s in range(200)]
    b = [select(sums, counts, tau=1.0, seed=s).index for s in range(200)]
    assert a == b
    assert len(set(a)) > 1  # it does sample


def test_generator_is_reproducible_and_advances() -> None:
    sums, counts = [-1.0, -1.2, -0.9], [1, 1, 1]
    r1, r2 = np.random.default_rng(7), np.random.default_rng(7)
    seq1 = [select(sums, counts, tau=0.5, seed=r1).index for _ in range(100)]
    seq2 = [select(sums, counts, tau=0.5, seed=r2).index for _ in range(100)]
    assert seq1 == seq2
    assert len(set(seq1)) > 1


def test_empirical_frequencies_follow_q() -> None:
    sums, counts = [-2.0, -1.0, -1.5, -6.0, -0.5], [2, 1, 3, 2, 1]
    tau = 0.7
    q = np.array(select(sums, counts, tau=tau, seed=0).q)
    rng = np.random.default_rng(12345)
    n = 20000
    hits = np.zeros(len(sums))
    for _ in range(n):
        hits[select(sums, counts, tau=tau, seed=rng).index] += 1
    freq = hits / n
    # 5 sigma of a binomial proportion, plus a little slack
    tol = 5 * np.sqrt(q * (1 - q) / n) + 1e-3
    assert np.all(np.abs(freq - q) <= tol), (freq, q)


def test_zero_probability_candidates_are_never_sampled() -> None:
    # exp(-1e5) underflows to 0: candidate 1 must never come out
    rng = np.random.default_rng(1)
    sel0 = select([0.0, -1e5], [1, 1], tau=1.0, seed=rng)
    assert sel0.q[1] == 0.0
    for _ in range(2000):
        assert select([0.0, -1e5], [1, 1], tau=1.0, seed=rng).index == 0


def test_tau_zero_ignores_randomness() -> None:
    assert {select([-1.0, -0.5], [1, 1], tau=0.0, seed=s).index for s in range(50)} == {1}


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"logprob_sums": [], "token_counts": []}, "empty"),
        ({"logprob_sums": [-1.0, -2.0], "token_counts": [1]}, "length"),
        ({"logprob_sums": [-1.0], "token_counts": [0]}, "token_counts[0]"),
        ({"logprob_sums": [-1.0, -1.0], "token_counts": [1, -3]}, "token_counts[1]"),
        ({"logprob_sums": [-1.0], "token_counts": [1.5]}, "integer"),
        ({"logprob_sums": [-1.0], "token_counts": [True]}, "integer"),
        ({"logprob_sums": [-1.0, float("nan")], "token_counts": [1, 1]}, "logprob_sums[1]"),
        ({"logprob_sums": [float("-inf")], "token_counts": [1]}, "not finite"),
        ({"logprob_sums": ["x"], "token_counts": [1]}, "numbers"),
        ({"logprob_sums": [-1.0], "token_counts": [1], "tau": -0.1}, "tau"),
        ({"logprob_sums": [-1.0], "token_counts": [1], "tau": float("nan")}, "tau"),
        ({"logprob_sums": [-1.0], "token_counts": [1], "tau": float("inf")}, "tau"),
        ({"logprob_sums": [-1.0], "token_counts": [1], "alpha": -1.0}, "alpha"),
        ({"logprob_sums": [-1.0], "token_counts": [1], "tau": 1.0, "seed": -5}, "seed"),
        ({"logprob_sums": [-1.0], "token_counts": [1], "tau": 1.0, "seed": "abc"}, "seed"),
    ],
)
def test_select_rejects_invalid_input(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        select(**kwargs)  # type: ignore[arg-type]
    assert fragment in info.value.message


def test_other_functions_validate_too() -> None:
    with pytest.raises(InvalidRequest):
        softmax_q([], 1.0)
    with pytest.raises(InvalidRequest):
        softmax_q([1.0, float("inf")], 1.0)
    with pytest.raises(InvalidRequest):
        softmax_q([1.0], -1.0)
    with pytest.raises(InvalidRequest):
        normalised_scores([-1.0], [1], alpha=float("nan"))
    with pytest.raises(InvalidRequest):
        normalised_scores([-1.0], [1, 2])


@settings(max_examples=50)
@given(st.lists(counts_st, min_size=1, max_size=8))
def test_counts_accept_numpy_integers(counts: list[int]) -> None:
    sums = [-1.0] * len(counts)
    assert normalised_scores(sums, list(np.asarray(counts, dtype=np.int64))) == normalised_scores(
        sums, counts
    )

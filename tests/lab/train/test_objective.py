"""The GRPO objectives against hand computations, finite differences and autograd references."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch

from ssr_lab.train.objective import (
    action_log_ratios,
    aggregate,
    candidate_scores,
    clipped_fraction,
    clipped_surrogate,
    group_advantages,
    k3_kl,
    log_q,
    selection_log_ratio,
)


@pytest.fixture(autouse=True)
def float64() -> Iterator[None]:
    """Finite differences need the precision; the default dtype is restored for the other tests."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


def test_scores_are_length_normalised() -> None:
    lps = [torch.tensor([-1.0, -3.0]), torch.tensor([-2.0]), torch.tensor([-1.0, -1.0, -4.0])]
    assert candidate_scores(lps).tolist() == pytest.approx([-2.0, -2.0, -2.0])
    assert candidate_scores(lps, alpha=0.0).tolist() == pytest.approx([-4.0, -2.0, -6.0])
    with pytest.raises(ValueError):
        log_q(torch.zeros(3), 0.0)


def test_first_update_has_ratio_one_and_nothing_clipped() -> None:
    """At theta = theta_old every ratio is 1 and no clip binds, for either sign of the advantage."""
    scores = torch.tensor([-1.2, -0.7, -2.0, -1.1], requires_grad=True)
    for grad in ("exact", "detached"):
        lr = selection_log_ratio(scores, scores.detach().clone(), 1, tau=1.0, grad=grad)  # type: ignore[arg-type]
        assert float(lr.detach()) == 0.0
        for adv in (1.0, -1.0):
            assert float(clipped_fraction(lr, adv, 0.2)) == 0.0
            assert float(clipped_surrogate(lr, adv, 0.2).detach()) == pytest.approx(-adv)
    logp = torch.tensor([-0.3, -2.0, -0.01])
    for level in ("token", "sequence"):
        assert action_log_ratios(logp, logp.clone(), level).tolist() == [0.0, 0.0, 0.0]  # type: ignore[arg-type]


def _surrogate(scores: torch.Tensor, old: torch.Tensor, z: int, tau: float, adv: float,
               grad: str) -> torch.Tensor:
    return clipped_surrogate(selection_log_ratio(scores, old, z, tau, grad), adv, eps=10.0)  # type: ignore[arg-type]


@pytest.mark.parametrize("tau", [1.0, 0.5, 2.0])
@pytest.mark.parametrize("adv", [1.3, -0.7])
def test_the_categorical_term_gradient_matches_finite_differences(tau: float, adv: float) -> None:
    """Exact mode: d/dS of -A * q_theta(z)/q_old(z), unclipped (wide eps), by central differences."""
    old = torch.tensor([-1.0, -0.4, -2.2, -0.9, -1.6])
    scores = old + torch.tensor([0.05, -0.1, 0.02, 0.07, -0.03])
    z = 3
    x = scores.clone().requires_grad_(True)
    _surrogate(x, old, z, tau, adv, "exact").backward()
    assert x.grad is not None
    h = 1e-6
    for i in range(5):
        up, down = scores.clone(), scores.clone()
        up[i] += h
        down[i] -= h
        fd = (_surrogate(up, old, z, tau, adv, "exact")
              - _surrogate(down, old, z, tau, adv, "exact")) / (2 * h)
        assert float(x.grad[i]) == pytest.approx(float(fd), rel=1e-6, abs=1e-9)
    # and the closed form: d rho / d S_i = rho * (1[i = z] - q_i) / tau
    q = torch.softmax(scores / tau, -1)
    rho = q[z] / torch.softmax(old / tau, -1)[z]
    want = -adv * rho * ((torch.arange(5) == z).double() - q) / tau
    torch.testing.assert_close(x.grad, want)


def test_exact_and_detached_gradients_differ_as_the_formulas_say() -> None:
    """Detached: only the chosen score gets a gradient, ``rho * (1 - q'_z) / tau`` where q' uses the
    competitors' old scores; exact: every score, ``rho * (1[i=z] - q_i) / tau``."""
    tau, z, adv = 0.8, 2, 1.0
    old = torch.tensor([-1.0, -0.5, -1.5, -0.8])
    new = torch.tensor([-0.9, -0.7, -1.2, -0.6])
    grads = {}
    for mode in ("exact", "detached"):
        x = new.clone().requires_grad_(True)
        _surrogate(x, old, z, tau, adv, mode).backward()
        assert x.grad is not None
        grads[mode] = x.grad.clone()
    q_exact = torch.softmax(new / tau, -1)
    rho_exact = q_exact[z] / torch.softmax(old / tau, -1)[z]
    torch.testing.assert_close(grads["exact"], -rho_exact * ((torch.arange(4) == z).double() - q_exact) / tau)
    mixed = old.clone()
    mixed[z] = new[z]
    q_det = torch.softmax(mixed / tau, -1)
    rho_det = q_det[z] / torch.softmax(old / tau, -1)[z]
    want = torch.zeros(4)
    want[z] = -rho_det * (1 - q_det[z]) / tau
    torch.testing.assert_close(grads["detached"], want)
    assert grads["detached"][[0, 1, 3]].abs().sum() == 0 and grads["exact"][[0, 1, 3]].abs().min() > 0


@pytest.mark.parametrize(("log_ratio", "adv", "flows"), [
    (math.log(1.5), 1.0, False),   # A > 0, rho above 1 + eps: clipped, no gradient
    (math.log(0.5), 1.0, True),    # A > 0, rho below 1 - eps: the unclipped branch is the min
    (math.log(0.5), -1.0, False),  # A < 0, rho below 1 - eps: clipped
    (math.log(1.5), -1.0, True),   # A < 0, rho above 1 + eps: unclipped, gradient flows
    (math.log(1.1), 1.0, True), (math.log(0.9), -1.0, True),  # inside the band
])
def test_clipping_stops_the_gradient_exactly_where_it_should(log_ratio: float, adv: float,
                                                             flows: bool) -> None:
    x = torch.tensor(log_ratio, requires_grad=True)
    loss = clipped_surrogate(x, adv, eps=0.2)
    loss.backward()
    assert x.grad is not None
    if flows:
        assert float(x.grad) == pytest.approx(-adv * math.exp(log_ratio))
    else:
        assert float(x.grad) == 0.0
        assert float(loss.detach()) == pytest.approx(-adv * (1.2 if log_ratio > 0 else 0.8))
    assert float(clipped_fraction(x, adv, 0.2)) == (0.0 if flows else 1.0)


def test_gspo_uses_one_length_normalised_ratio() -> None:
    old = torch.tensor([-1.0, -2.0, -0.5, -1.5])
    new = (old + torch.tensor([0.2, -0.1, 0.3, 0.0])).requires_grad_(True)
    seq = action_log_ratios(new, old, "sequence")
    assert seq.tolist() == pytest.approx([0.1] * 4)
    seq.sum().backward()
    assert new.grad is not None
    assert new.grad.tolist() == pytest.approx([1.0] * 4)  # each of the 4 copies: d(mean) = 1/4
    tok = action_log_ratios(new.detach(), old, "token")
    assert tok.tolist() == pytest.approx([0.2, -0.1, 0.3, 0.0])


def test_group_advantages_and_kl() -> None:
    adv = group_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0]))
    assert adv.tolist() == pytest.approx([1.0, -1.0, 1.0, -1.0], abs=1e-5)
    assert group_advantages(torch.tensor([1.0, 1.0, 1.0])).tolist() == [0.0, 0.0, 0.0]  # no signal, no update
    logp = torch.tensor([-1.0, -2.0])
    assert k3_kl(logp, logp.clone()).tolist() == [0.0, 0.0]
    d = 0.3
    kl = k3_kl(torch.tensor([-1.0]), torch.tensor([-1.0 + d]))
    assert float(kl[0]) == pytest.approx(math.exp(d) - d - 1)


def test_loss_aggregation_by_hand() -> None:
    sel = torch.tensor([0.5, -1.0])  # two turns' selection losses
    tok = torch.tensor([0.2, 0.4, -0.6, 1.0, 0.0])  # five action tokens
    assert float(aggregate(sel, tok, gamma=1.0)) == pytest.approx((0.5 - 1.0 + 0.2 + 0.4 - 0.6 + 1.0) / 7)
    assert float(aggregate(sel, tok, gamma=3.0)) == pytest.approx((3 * -0.5 + 1.0) / (6 + 5))
    assert float(aggregate(torch.zeros(0), torch.zeros(0)).detach()) == 0.0

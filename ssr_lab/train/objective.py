"""The GRPO objectives, as pure functions of scores and log-probabilities (tested against hand
computations, finite differences and autograd references in ``tests/train/test_objective.py``).

SSR's reasoning is one categorical choice per turn: candidate z among K, with ``q = softmax(S / tau)``
over the length-normalised scores ``S_i = K_i^-alpha * sum(logp)``. Its PPO ratio is the ratio of that
choice's probabilities, ``rho = q_theta(z|h) / q_old(z|h)``, one number per turn instead of one per
reasoning token. ``exact`` differentiates through all K scores (K is small: affordable); ``detached``
holds the competitors at their rollout values, the approximation the SSR paper uses, so that only the
chosen candidate needs a forward with gradient. Action tokens keep the usual per-token ratios (GRPO) or
one length-normalised ratio per action (GSPO).
"""

from __future__ import annotations

from typing import Literal

import torch

from ssr_server.core.selection import DEFAULT_ALPHA, length_normalised

SelectorGrad = Literal["exact", "detached"]
RatioLevel = Literal["token", "sequence"]


def candidate_scores(logprobs: list[torch.Tensor], alpha: float = DEFAULT_ALPHA) -> torch.Tensor:
    """``S`` (K,) from each candidate's token log-probabilities, by the server's own formula."""
    return torch.stack([candidate_score(lp, alpha) for lp in logprobs])


def candidate_score(logprobs: torch.Tensor, alpha: float = DEFAULT_ALPHA) -> torch.Tensor:
    """One candidate's ``S = K^-alpha * sum(logp)`` from its token log-probabilities (gradient kept)."""
    return length_normalised(logprobs.sum(), logprobs.numel(), alpha)


def log_q(scores: torch.Tensor, tau: float) -> torch.Tensor:
    """``log softmax(S / tau)`` (K,)."""
    if tau <= 0:
        raise ValueError("the selection distribution needs tau > 0 (tau = 0 is a deterministic argmax)")
    return torch.log_softmax(scores / tau, dim=-1)


def selection_log_ratio(scores: torch.Tensor, old_scores: torch.Tensor, chosen: int, tau: float,
                        grad: SelectorGrad = "exact") -> torch.Tensor:
    """``log q_theta(z) - log q_old(z)``; with ``detached`` the competitors' scores are the old ones."""
    if grad == "detached":
        keep = torch.zeros_like(scores, dtype=torch.bool)
        keep[chosen] = True
        scores = torch.where(keep, scores, old_scores.detach())
    return log_q(scores, tau)[chosen] - log_q(old_scores.detach(), tau)[chosen]


def clipped_surrogate(log_ratio: torch.Tensor, advantage: torch.Tensor | float, eps: float,
                      eps_high: float | None = None) -> torch.Tensor:
    """PPO's per-element loss ``-min(rho * A, clip(rho, 1 - eps, 1 + eps_high) * A)``.

    Where clipping binds (rho beyond the band on the side the advantage pushes it to) the gradient is
    exactly zero: the clipped branch is a constant."""
    ratio = torch.exp(log_ratio)
    adv = torch.as_tensor(advantage, dtype=ratio.dtype)
    high = eps if eps_high is None else eps_high
    return -torch.minimum(ratio * adv, torch.clamp(ratio, 1 - eps, 1 + high) * adv)


def clipped_fraction(log_ratio: torch.Tensor, advantage: torch.Tensor | float, eps: float) -> torch.Tensor:
    """The share of elements whose clipped branch is the active one (for logging)."""
    ratio = torch.exp(log_ratio.detach())
    adv = torch.as_tensor(advantage, dtype=ratio.dtype)
    clipped = ((adv > 0) & (ratio > 1 + eps)) | ((adv < 0) & (ratio < 1 - eps))
    return clipped.float().mean() if clipped.numel() else torch.zeros(())


def action_log_ratios(logp: torch.Tensor, old_logp: torch.Tensor,
                      level: RatioLevel = "token") -> torch.Tensor:
    """Per-token log ratios (T,) or, for GSPO, the length-normalised sequence log ratio broadcast to
    every token (its gradient flows through the mean: ``d/dlogp_j = 1/T``)."""
    diff = logp - old_logp.detach()
    if level == "sequence":
        return diff.mean().expand_as(diff)
    return diff


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``(r - mean) / (std + eps)`` within a group of rollouts of one question (0 when all agree)."""
    std = rewards.std(unbiased=False)
    return (rewards - rewards.mean()) / (std + eps)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref): ``exp(ref - logp) - (ref - logp) - 1`` (>= 0)."""
    d = ref_logp.detach() - logp
    return torch.exp(d) - d - 1


def aggregate(selection_losses: torch.Tensor, token_losses: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """One number: every action token counts 1, every selection decision ``gamma`` (a turn's reasoning
    is one decision, not one per token), normalised by the total weight of the batch."""
    total = gamma * selection_losses.numel() + token_losses.numel()
    if total == 0:
        return torch.zeros((), requires_grad=True)
    return (gamma * selection_losses.sum() + token_losses.sum()) / total

"""What the RL objective needs from the model for one rollout, with gradient: the log-probabilities of
the tokens the policy sampled, and, per SSR turn, the scores of all K candidates.

One forward runs the whole trajectory (the final context, images included) and keeps its key/value
states. The chosen candidate's log-probabilities are read off that forward (its tokens are in the
trajectory). The other candidates branch off the context where the turn's reasoning starts: one small
forward per turn of the K candidates on the trajectory's key/value states up to that point (expanded,
not copied), exactly as the engine scores them at serving time - so the exact gradient through all K
scores costs K * ~30 tokens per turn, not K more trajectories.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ssr_lab.train.data import Collator, Example
from ssr_lab.train.objective import candidate_score
from ssr_server.core.selection import DEFAULT_ALPHA


@dataclass(frozen=True)
class TurnRecord:
    reasoning: tuple[int, int] | None  # [start, end) compact: the chosen candidate (ssr) or decoded reasoning
    action: tuple[int, int] | None  # [start, end) compact: the decoded action tokens
    chosen: int | None  # ssr: the chosen candidate's index
    served_scores: tuple[float, ...] | None = None  # ssr: the K scores the engine computed when selecting


@dataclass(frozen=True)
class Rollout:
    key: str
    question_id: str
    example: Example  # the final context (its mask is unused here)
    turns: tuple[TurnRecord, ...]
    reward: float
    correct: bool
    advantage: float = 0.0


@dataclass
class PolicyTerms:
    scores: list[torch.Tensor]  # per ssr turn: (K,) candidate scores S
    token_logps: list[torch.Tensor]  # per turn: (n,) log-probabilities of the sampled tokens trained on


def _branch_logps(model: Any, cache: Any, hidden: torch.Tensor, position: torch.Tensor, start: int,
                  candidates: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """Log-probabilities of each candidate's tokens continuing the trajectory's first ``start`` tokens."""
    from transformers import DynamicCache

    k = len(candidates)
    t = max(len(c) for c in candidates)
    branch = DynamicCache()
    for i, layer in enumerate(cache.layers):
        branch.update(layer.keys[:, :, :start].expand(k, -1, -1, -1),
                      layer.values[:, :, :start].expand(k, -1, -1, -1), i)
    ids = torch.zeros((k, t), dtype=torch.long)
    attention = torch.zeros((k, start + t), dtype=torch.long)
    attention[:, :start] = 1
    for r, c in enumerate(candidates):
        ids[r, : len(c)] = torch.tensor(list(c))
        attention[r, start : start + len(c)] = 1
    # a candidate's tokens are text: all three M-RoPE positions advance together from the start
    pos = (position.view(3, 1, 1) + torch.arange(t).view(1, 1, -1)).expand(3, k, t)
    out = model.model.language_model(input_ids=ids, position_ids=pos, attention_mask=attention, cache=branch)
    first = torch.log_softmax(model.lm_head(hidden).float(), -1)  # the context's last state: token 0 of each
    rest = torch.log_softmax(model.lm_head(out.last_hidden_state[:, :-1]).float(), -1)  # (K, t - 1, V)
    result = []
    for r, c in enumerate(candidates):
        lp = [first[c[0]]] + [rest[r, j - 1, c[j]] for j in range(1, len(c))]
        result.append(torch.stack(lp))
    return result


def policy_terms(model: Any, collator: Collator, rollout: Rollout,
                 candidates: Sequence[Sequence[int]] | None, *, all_scores: bool,
                 alpha: float = DEFAULT_ALPHA, train_reasoning: bool = False) -> PolicyTerms:
    """The terms of ``rollout`` under ``model`` (gradient flows unless called under ``no_grad``).

    ``candidates``: the library's candidate token ids (ssr rollouts); with ``all_scores`` every turn's K
    scores are computed (the exact selector gradient, and the old scores), otherwise only the chosen
    one's (the detached mode, with the others taken from the old pass). ``train_reasoning``: freeform,
    whose decoded reasoning tokens are trained like the action's."""
    ids, _, pixels, grids, where = collator.expand_mapped(rollout.example)
    full = torch.tensor([ids])
    grid = torch.cat(grids) if grids else None
    base = model.model
    image_token = int(model.config.image_token_id)
    pos, _ = base.get_rope_index(full, (full == image_token).int(), image_grid_thw=grid)
    kwargs: dict[str, Any] = {}
    if pixels:
        kwargs = {"pixel_values": torch.cat(pixels), "image_grid_thw": grid,
                  "mm_token_type_ids": (full == image_token).int()}
    need_cache = candidates is not None and all_scores
    out = base(input_ids=full, position_ids=pos, use_cache=need_cache, **kwargs)
    hidden: torch.Tensor = out.last_hidden_state[0]  # (L, hidden)

    def logps(span: tuple[int, int]) -> torch.Tensor:
        q = torch.tensor([where[i] for i in range(*span)], dtype=torch.long)
        if q.numel() == 0:
            return hidden.new_zeros(0)
        lp = torch.log_softmax(model.lm_head(hidden[q - 1]).float(), -1)
        out_lp: torch.Tensor = lp.gather(1, full[0, q].view(-1, 1))[:, 0]
        return out_lp

    scores: list[torch.Tensor] = []
    token_logps: list[torch.Tensor] = []
    for turn in rollout.turns:
        tok: list[torch.Tensor] = []
        if turn.reasoning is not None and candidates is not None and turn.chosen is not None:
            # The chosen candidate's score is always read off the trajectory (the same arithmetic in
            # every pass, so the first update's ratio is exactly 1); the others branch off it.
            chosen = logps(turn.reasoning)
            s_chosen = candidate_score(chosen, alpha)
            if all_scores:
                start = where[turn.reasoning[0]]
                branch = _branch_logps(model, out.cache, hidden[start - 1], pos[:, 0, start], start,
                                       candidates)
                scores.append(torch.stack([s_chosen if i == turn.chosen else candidate_score(lp, alpha)
                                           for i, lp in enumerate(branch)]))
            else:  # only the chosen score carries a gradient; the others come from the old pass
                s = torch.zeros(len(candidates))
                s[turn.chosen] = s_chosen
                scores.append(s)
        elif turn.reasoning is not None and train_reasoning:
            tok.append(logps(turn.reasoning))
        if turn.action is not None:
            tok.append(logps(turn.action))
        token_logps.append(torch.cat(tok) if tok else hidden.new_zeros(0))
    return PolicyTerms(scores, token_logps)

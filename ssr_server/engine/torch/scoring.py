"""Packed candidate scoring: the chunks of a set of score jobs and the log-probabilities from their outputs.

Each candidate is a chunk on its context's cached KV, with rotary positions that restart after the
context; token j of a candidate is predicted by the context's last logits (j = 0) or by the
candidate's row j - 1, so one log-softmax and one gather cover every candidate of every job.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from ssr_server.engine.base import CandidateScore
from ssr_server.engine.torch.prefix_cache import CacheEntry, CandidateKV

ScoreJobs = list[tuple[CacheEntry, list[list[int]]]]


def score_chunks(jobs: ScoreJobs, dims: int, device: torch.device,
                 ) -> Iterator[tuple[CacheEntry, list[int], torch.Tensor, list[int]]]:
    """(entry, ids, positions (dims, k), logits rows) of every candidate of every job, in order."""
    for entry, cands in jobs:
        for cand in cands:
            yield entry, list(cand), candidate_positions(entry.next_pos, len(cand), dims, device), \
                list(range(len(cand)))


def candidate_positions(start: int, k: int, dims: int, device: torch.device) -> torch.Tensor:
    """(dims, k) rotary positions of a candidate that starts at ``start`` (every M-RoPE axis alike)."""
    return torch.arange(start, start + k, device=device).view(1, -1).expand(dims, -1)


def _groups(outs: Sequence[Any], sizes: list[int]) -> list[list[Any]]:
    groups, i = [], 0
    for n in sizes:
        groups.append(list(outs[i : i + n]))
        i += n
    return groups


def score_results(jobs: ScoreJobs, outs: Sequence[Any], cached: Sequence[int] | None,
                  device: torch.device) -> list[list[CandidateScore]]:
    """Per job, the candidates' scores; each entry keeps its candidates' KV (the latest scoring only:
    bounded memory) so that the generation after selection continues from it."""
    groups = _groups(outs, [len(c) for _, c in jobs])
    dists, targets = [], []
    for (entry, cands), group in zip(jobs, groups, strict=True):
        for cand, out in zip(cands, group, strict=True):
            dists += [entry.last_logits.view(1, -1), out.logits[:-1]]
            targets += cand
    index = torch.tensor(targets, dtype=torch.long, device=device).view(-1, 1)
    flat = torch.log_softmax(torch.cat(dists), dim=-1).gather(1, index)[:, 0].tolist()
    results: list[list[CandidateScore]] = []
    i = 0
    for j, ((entry, cands), group) in enumerate(zip(jobs, groups, strict=True)):
        n_ctx = entry.kv.length
        hit = n_ctx if cached is None else cached[j]
        scores: list[CandidateScore] = []
        keep: dict[tuple[int, ...], CandidateKV] = {}
        for cand, out in zip(cands, group, strict=True):
            scores.append(CandidateScore(tuple(flat[i : i + len(cand)]), cached_tokens=hit,
                                         context_tokens=n_ctx))
            i += len(cand)
            keep[tuple(cand)] = CandidateKV([k.clone() for k in out.keys], [v.clone() for v in out.values],
                                            out.logits[-1].clone())
        entry.candidates = keep
        results.append(scores)
    return results

"""Packed candidate scoring: the chunks of a set of score jobs and the log-probabilities from their outputs.

Each candidate is a chunk on its context's cached KV, with rotary positions that restart after the
context; token j of a candidate is predicted by the context's last logits (j = 0) or by the
candidate's row j - 1. The forward turns rows into log-probabilities itself (``token_logprobs``): the
(rows, vocab) logits of a selection never exist whole, only its candidates' last rows (the next-token
distribution after a candidate, kept for the generation that follows if it is chosen).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from ssr_server.core.errors import EngineError
from ssr_server.core.protocol import CandidateScore
from ssr_server.engine.torch.cpu_bf16 import fp32_rows
from ssr_server.engine.torch.prefix_cache import CacheEntry, CandidateKV

ScoreJobs = list[tuple[CacheEntry, list[list[int]]]]


# Words of the output head computed at once by ``token_logprobs``: (rows, 8192) float32 logits at a time.
VOCAB_BLOCK = 8192


def score_chunks(jobs: ScoreJobs, dims: int, device: torch.device,
                 ) -> Iterator[tuple[CacheEntry, list[int], torch.Tensor, list[int]]]:
    """(entry, ids, positions (dims, k), logits rows: the last) of every candidate of every job, in order."""
    for entry, cands in jobs:
        for cand in cands:
            yield entry, list(cand), candidate_positions(entry.next_pos, len(cand), dims, device), \
                [len(cand) - 1]


@torch.inference_mode()
def token_logprobs(head: torch.nn.Linear, hidden: torch.Tensor, targets: torch.Tensor,
                   vocab_block: int = VOCAB_BLOCK) -> torch.Tensor:
    """(n,) float32 log p(targets[r] | hidden[r]) for hidden (n, d), targets (n,) long: the same figures
    as ``log_softmax(head(hidden)).gather(targets)``, to float rounding.

    The head runs one block of the vocabulary at a time with an online log-sum-exp (a running max and
    sum, as flash attention keeps over keys): the (n, vocab) logits never exist whole (on Qwen3's
    151,936 words, 207 MiB per copy for one selection's 357 rows; the engine held three), and the
    head's weight is still read once whatever n (blocks of rows would read it once per block). A
    head that ``cpu_bf16`` routes through the fp32 kernel multiplies in fp32 here too, from the same
    row count."""
    weight, bias = head.weight, head.bias  # (vocab, d), (vocab,) or None
    n, vocab = int(targets.shape[0]), int(weight.shape[0])
    routed = fp32_rows(head)
    x = hidden.float() if routed is not None and n >= routed else hidden
    top = torch.full((n,), float("-inf"), dtype=torch.float32, device=hidden.device)
    total = torch.zeros(n, dtype=torch.float32, device=hidden.device)
    picked = torch.zeros(n, dtype=torch.float32, device=hidden.device)
    for a in range(0, vocab, vocab_block):
        w = weight[a : a + vocab_block].to(x.dtype)
        b = None if bias is None else bias[a : a + vocab_block].to(x.dtype)
        z = torch.nn.functional.linear(x, w, b).float()  # (n, block): fresh, ours to overwrite
        local = targets - a
        inside = (local >= 0) & (local < z.shape[1])
        here = z.gather(1, local.clamp(0, z.shape[1] - 1).view(-1, 1))[:, 0]
        picked = torch.where(inside, here, picked)
        m = torch.maximum(top, z.amax(dim=-1))
        total = total * (top - m).exp() + z.sub_(m.view(-1, 1)).exp_().sum(dim=-1)
        top = m
    return picked - (top + total.log())


def chunk_logprobs(head: torch.nn.Linear, chunks: Sequence[Any], hidden: torch.Tensor,
                   ) -> dict[int, torch.Tensor]:
    """Per offset in the packed row, the log-probabilities of its own tokens for every runner ``Chunk``
    that asks (``self_logprobs``): (t - 1,) each, all of them from one ``token_logprobs`` pass over
    hidden (T, d), the forward's last hidden states."""
    rows: list[int] = []
    targets: list[int] = []
    spans: dict[int, tuple[int, int]] = {}
    o = 0
    for c in chunks:
        if c.self_logprobs:
            spans[o] = (len(rows), len(rows) + len(c.ids) - 1)
            rows.extend(range(o, o + len(c.ids) - 1))
            targets.extend(c.ids[1:])
        o += len(c.ids)
    if not spans:
        return {}
    dev = hidden.device
    lp = token_logprobs(head, hidden[torch.tensor(rows, dtype=torch.long, device=dev)],
                        torch.tensor(targets, dtype=torch.long, device=dev))  # (sum of t - 1,)
    return {o: lp[a:b] for o, (a, b) in spans.items()}


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
    parts: list[torch.Tensor] = []
    for (entry, cands), group in zip(jobs, groups, strict=True):
        # each candidate's first token is predicted by its context's last logits: one row per job
        first = torch.tensor([c[0] for c in cands], dtype=torch.long, device=device)
        lp0 = torch.log_softmax(entry.last_logits.float(), dim=-1)[first]  # (K,)
        for j, out in enumerate(group):
            if out.logprobs is None:
                raise EngineError("internal: a candidate chunk ran without its own log-probabilities")
            parts += [lp0[j : j + 1], out.logprobs]
    flat = torch.cat(parts).tolist() if parts else []
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

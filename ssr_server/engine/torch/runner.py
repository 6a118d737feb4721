"""One packed forward for many chunks, and the prefill / score / decode steps built on it.

A *chunk* is a run of new tokens that attends to one cached past (fully) and to itself (causally).
Any mix of chunks goes into ONE row: the distinct pasts side by side, then the chunks. The additive
mask (1, 1, T, P + T) lets each chunk see only its own past and its own earlier tokens, and explicit
rotary positions restart after each chunk's past. This one mechanism gives:

- SSR scoring: K candidate chunks on the same context past, one forward, one shared KV;
- batching across runs: prefills, candidate sets or decode steps of concurrent runs in one forward;
- incremental prefill: a chunk of new context tokens on a cached prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ssr_server.engine.base import CandidateScore, Context
from ssr_server.engine.torch import segments
from ssr_server.engine.torch.kv import SeqKV
from ssr_server.engine.torch.loader import LoadedModel
from ssr_server.engine.torch.multimodal import Expanded, ImageCache, expand, images_in, positions, safe_cut
from ssr_server.engine.torch.prefix_cache import CacheEntry, CandidateKV, PrefixCache
from ssr_server.errors import InvalidRequest


@dataclass
class Chunk:
    past: SeqKV | None
    ids: list[int]
    pos: torch.Tensor  # (1, t) text models, (3, t) M-RoPE
    logits_rows: list[int]  # rows of this chunk whose next-token logits are needed
    pixel_values: torch.Tensor | None = None
    grid_thw: torch.Tensor | None = None
    past_len: int = 0


@dataclass
class ChunkOut:
    logits: torch.Tensor  # (len(logits_rows), vocab) float32
    keys: list[torch.Tensor]  # per layer (1, kv_heads, t, head_dim): views, copy to keep
    values: list[torch.Tensor]
    inplace: bool  # the keys/values were written into the past's spare capacity


@dataclass
class Prepared:
    """A context resolved against the prefix cache: what is reused, what must still be prefilled."""

    exp: Expanded
    kv: SeqKV | None  # private KV holding the reused prefix (None: nothing reused)
    reused: int
    next_pos: int
    entry: CacheEntry | None = None  # set when the whole context is already cached
    last_logits: torch.Tensor | None = None
    cached_tokens: int = -1  # tokens found in the prefix cache (reused before any prefill)

    def __post_init__(self) -> None:
        if self.cached_tokens < 0:
            self.cached_tokens = self.reused

    @property
    def todo(self) -> int:
        return len(self.exp.ids) - self.reused


class ModelRunner:
    def __init__(self, lm: LoadedModel, prefix_cache: PrefixCache, image_cache: ImageCache | None = None):
        self.lm = lm
        self.cache = prefix_cache
        self.images = image_cache or ImageCache()
        text = lm.model.config.get_text_config()
        self.num_layers = int(text.num_hidden_layers)
        self.kv_heads = int(getattr(text, "num_key_value_heads", None) or text.num_attention_heads)
        self.head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)
        self.vocab_size = int(text.vocab_size)
        self._text_model = getattr(lm.base, "language_model", lm.base)

    # ---- the packed forward -------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, chunks: list[Chunk]) -> list[ChunkOut]:
        """All chunks in one row through the linear layers; attention per segment (see segments.py)."""
        lm = self.lm
        segs = segments.plan(chunks, lm.dtype)
        t_total = segs[-1].end if segs else 0
        ids = torch.tensor([[i for c in chunks for i in c.ids]], dtype=torch.long)
        pos = torch.cat([c.pos for c in chunks], dim=1).unsqueeze(1)  # (dims, 1, T)
        kwargs: dict[str, Any] = {}
        pix = [c.pixel_values for c in chunks if c.pixel_values is not None]
        if pix:
            kwargs["pixel_values"] = torch.cat(pix, dim=0)
            kwargs["image_grid_thw"] = torch.cat([c.grid_thw for c in chunks if c.grid_thw is not None])
        if not lm.is_vl:
            pos = pos[0]  # (1, T)
        cache = segments.SegmentCache(self.num_layers)
        # a prepared 4D mask is passed through untouched by transformers; the segments replace it
        unused_mask = torch.zeros((1, 1, t_total, 1), dtype=lm.dtype, device=lm.device)
        with segments.segments(self._text_model, segs):
            out = lm.base(input_ids=ids.to(lm.device), attention_mask=unused_mask,
                          position_ids=pos.to(lm.device), cache=cache, use_cache=True, **kwargs)
        hidden = out.last_hidden_state[0]  # (T, hidden)
        rows: list[int] = []
        o = 0
        for c in chunks:
            rows.extend(o + r for r in c.logits_rows)
            o += len(c.ids)
        logits = lm.lm_head(hidden[rows]).float() if rows else hidden.new_zeros((0, self.vocab_size))
        inplace = {s.start + a: s.inplace for s in segs for a, _ in s.bounds}
        results: list[ChunkOut] = []
        o = r = 0
        for c in chunks:
            t, n = len(c.ids), len(c.logits_rows)
            keys, values = cache.new_kv(o, o + t)
            results.append(ChunkOut(logits[r : r + n], keys, values, inplace[o]))
            o += t
            r += n
        return results

    # ---- contexts -----------------------------------------------------------------------------
    def prepare(self, ctx: Context, reuse_candidates: bool = False) -> Prepared:
        exp = expand(self.lm, ctx, self.images)
        if not exp.ids:
            raise InvalidRequest("empty context")
        key, n_tok = exp.key, len(exp.ids)
        match = self.cache.lookup(key)
        if match is not None and match.length == len(match.entry.key):
            entry = match.entry
            if match.length == n_tok:
                return Prepared(exp, None, n_tok, entry.next_pos, entry=entry, last_logits=entry.last_logits)
            rest = key[match.length :]
            cand = None
            if reuse_candidates:
                for ck, cv in entry.candidates.items():
                    if rest[: len(ck)] == ck and (cand is None or len(ck) > len(cand[0])):
                        cand = (ck, cv)
            kv = entry.kv.fork(extra=n_tok - match.length + 64)
            reused, next_pos, last = match.length, entry.next_pos, entry.last_logits
            if cand is not None:
                kv.append(cand[1].keys, cand[1].values)
                reused += len(cand[0])
                next_pos += len(cand[0])
                last = cand[1].last_logits
            return Prepared(exp, kv, reused, next_pos, last_logits=last)
        if match is not None:
            use = safe_cut(exp, min(match.length, n_tok - 1))
            if use > 0:
                _, next_pos = positions(self.lm, exp, 0, use, 0)
                return Prepared(exp, match.entry.kv.fork(use, extra=n_tok - use + 64), use, next_pos)
        return Prepared(exp, None, 0, 0)

    def prefill_chunk(self, p: Prepared) -> Chunk:
        start, end = p.reused, len(p.exp.ids)
        pos, _ = positions(self.lm, p.exp, start, end, p.next_pos)
        pv, grid = images_in(p.exp, start, end)
        return Chunk(p.kv, p.exp.ids[start:end], pos, [end - start - 1], pv, grid,
                     past_len=p.kv.length if p.kv is not None else 0)

    def commit(self, p: Prepared, out: ChunkOut) -> SeqKV:
        """Make ``p``'s private KV hold the whole context after its prefill chunk ran."""
        t = len(p.exp.ids) - p.reused
        if p.kv is None:
            p.kv = SeqKV.empty(self.num_layers, self.kv_heads, self.head_dim, self.lm.dtype,
                               self.lm.device, capacity=t + 64)
        if out.inplace:
            p.kv.length += t
        else:
            p.kv.append(out.keys, out.values)
        _, p.next_pos = positions(self.lm, p.exp, p.reused, len(p.exp.ids), p.next_pos)
        p.reused = len(p.exp.ids)
        p.last_logits = out.logits[-1]
        return p.kv

    def prefill(self, preps: list[Prepared], insert: bool = True) -> None:
        """Prefill every prepared context that needs it, in one forward; cache the results."""
        todo = [p for p in preps if p.entry is None and p.todo > 0]
        if todo:
            outs = self.forward([self.prefill_chunk(p) for p in todo])
            for p, out in zip(todo, outs, strict=True):
                self.commit(p, out)
        for p in preps:
            if p.entry is None and insert:
                assert p.kv is not None and p.last_logits is not None  # internal invariant
                p.entry = CacheEntry(p.exp.key, p.kv, p.last_logits, p.next_pos)
                self.cache.insert(p.entry)

    # ---- scoring ------------------------------------------------------------------------------
    def score_context(self, ctx: Context, candidates: list[list[int]]) -> list[CandidateScore]:
        """Synchronous one-context scoring (benchmarks, tests): resolve, prefill, one packed pass."""
        p = self.prepare(ctx)
        self.prefill([p])
        assert p.entry is not None  # internal invariant: prefill inserts the entry
        return self.score([(p.entry, candidates)], cached=[p.cached_tokens])[0]

    def score(self, jobs: list[tuple[CacheEntry, list[list[int]]]],
              cached: Sequence[int] | None = None) -> list[list[CandidateScore]]:
        """Teacher-forced log-probabilities of every job's candidates, all in one forward.

        ``cached[i]``: context tokens of job i found in the prefix cache before this call (default:
        the whole context, i.e. it was prefilled earlier)."""
        return self.score_results(jobs, self.forward(self.score_chunks(jobs)), cached)

    def score_chunks(self, jobs: list[tuple[CacheEntry, list[list[int]]]]) -> list[Chunk]:
        """One chunk per candidate, on its context's cached KV (positions restart after the context)."""
        chunks: list[Chunk] = []
        dims = 3 if self.lm.is_vl else 1
        for entry, cands in jobs:
            for cand in cands:
                k = len(cand)
                pos = torch.arange(entry.next_pos, entry.next_pos + k).view(1, -1).expand(dims, -1)
                chunks.append(Chunk(entry.kv, list(cand), pos, list(range(k)), past_len=entry.kv.length))
        return chunks

    def score_results(self, jobs: list[tuple[CacheEntry, list[list[int]]]], outs: list[ChunkOut],
                      cached: Sequence[int] | None = None) -> list[list[CandidateScore]]:
        """Log-probabilities from the outputs of ``score_chunks``; keeps the candidates' KV."""
        # Token j of a candidate is predicted by the context's last logits (j = 0) or by candidate row
        # j - 1: one log-softmax and one gather over every candidate of every job.
        dists, targets = [], []
        for (entry, cands), group in zip(jobs, _groups(outs, [len(c) for _, c in jobs]), strict=True):
            for cand, out in zip(cands, group, strict=True):
                dists += [entry.last_logits.view(1, -1), out.logits[:-1]]
                targets += cand
        lp = torch.log_softmax(torch.cat(dists), dim=-1).gather(1, torch.tensor(targets).view(-1, 1))[:, 0]
        flat = lp.tolist()
        results: list[list[CandidateScore]] = []
        i = 0
        for j, ((entry, cands), group) in enumerate(
                zip(jobs, _groups(outs, [len(c) for _, c in jobs]), strict=True)):
            n_ctx = entry.kv.length
            hit = n_ctx if cached is None else cached[j]
            scores: list[CandidateScore] = []
            keep: dict[tuple[int, ...], CandidateKV] = {}
            for cand, out in zip(cands, group, strict=True):
                scores.append(CandidateScore(tuple(flat[i : i + len(cand)]), cached_tokens=hit,
                                             context_tokens=n_ctx))
                i += len(cand)
                keep[tuple(cand)] = CandidateKV([k.clone() for k in out.keys],
                                                [v.clone() for v in out.values], out.logits[-1].clone())
            entry.candidates = keep  # only the latest scoring: bounded memory
            self.cache.touch(entry)
            results.append(scores)
        return results

    # ---- reference ----------------------------------------------------------------------------
    @torch.inference_mode()
    def naive_score(self, ctx: Context, candidates: list[list[int]]) -> list[CandidateScore]:
        """One plain full forward per candidate through transformers' own path: the reference."""
        exp = expand(self.lm, ctx, self.images)
        n = len(exp.ids)
        pv, grid = images_in(exp, 0, n)
        scores = []
        for cand in candidates:
            ids = torch.tensor([exp.ids + list(cand)], dtype=torch.long)
            kwargs: dict[str, Any] = {}
            if pv is not None:
                kwargs = {"pixel_values": pv, "image_grid_thw": grid,
                          "mm_token_type_ids": torch.eq(ids, self.lm.image_token_id or -1).int()}
            # logits only where they are needed (the last K + 1 rows, the last dropped): a fair baseline
            k = len(cand)
            logits = self.lm.model(input_ids=ids, use_cache=False, logits_to_keep=k + 1,
                                   **kwargs).logits[0].float()
            lp = torch.log_softmax(logits[:k], dim=-1)
            lp = lp.gather(1, torch.tensor(cand).view(-1, 1))[:, 0]
            scores.append(CandidateScore(tuple(float(x) for x in lp)))
        return scores


def _groups(outs: list[ChunkOut], sizes: list[int]) -> list[list[ChunkOut]]:
    groups, i = [], 0
    for n in sizes:
        groups.append(outs[i : i + n])
        i += n
    return groups

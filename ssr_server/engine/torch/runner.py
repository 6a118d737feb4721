"""One packed forward for many chunks, and the prefill / score steps built on it.

A *chunk* is a run of new tokens that attends to one cached past (fully) and to itself (causally).
Any mix of chunks goes into ONE row: the distinct pasts side by side, then the chunks. Attention runs
per past (segments.py), and explicit rotary positions restart after each chunk's past. This one
mechanism gives:

- SSR scoring: K candidate chunks on the same context past, one forward, one shared KV;
- batching across runs: prefills, candidate sets or decode steps of concurrent runs in one forward;
- (chunked) prefill: chunks of new context tokens on a cached prefix, each continuing the last.

Prefill has ONE path, used by the scheduler and by the synchronous helpers (benchmarks, tests):
``prepare`` (prefix cache, KV reserved for what follows), ``prefill_chunk`` / ``commit`` per chunk,
``finish_prefill`` (into the cache). Every tensor is made on the model's device.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ssr_server.core.errors import ContextTooLong, EngineError, InvalidRequest
from ssr_server.core.protocol import CandidateScore, Context
from ssr_server.engine.torch import segments
from ssr_server.engine.torch.kv import SeqKV
from ssr_server.engine.torch.loader import LoadedModel
from ssr_server.engine.torch.multimodal import Expanded, ImageCache, expand, images_in, positions, safe_cut
from ssr_server.engine.torch.prefix_cache import CacheEntry, PrefixCache
from ssr_server.engine.torch.scoring import candidate_positions, chunk_logprobs, score_chunks, score_results


@dataclass
class Chunk:
    past: SeqKV | None
    ids: list[int]
    pos: torch.Tensor  # (1, t) text models, (3, t) M-RoPE; on the model's device
    logits_rows: list[int]  # rows of this chunk whose next-token logits are needed
    pixel_values: torch.Tensor | None = None
    grid_thw: torch.Tensor | None = None
    past_len: int = 0
    next_pos: int = 0  # the rotary position after the chunk (prefill chunks)
    # Also attends to the first chunk of its segment: candidates scored in the very forward that
    # prefills their context's new tokens (see ``fused_score_chunks``).
    sees_first: bool = False
    # Also return log p(ids[r + 1] | up to row r) for every row but the last: a candidate teacher-forced
    # on its own tokens, without its (t, vocab) logits (see ``scoring.token_logprobs``).
    self_logprobs: bool = False
    # A tree draft (a decode step): ids are the fed token, then chains of these lengths side by side,
    # each attending to the past, the fed token and its own earlier tokens (segments.plan).
    branches: list[int] | None = None
    # Rows from this one on attend each as a one-token decode step would, whatever follows them in the
    # chunk (a draft verified in reduced precision: see ``segments``); None: the chunk attends at once.
    alone_from: int | None = None
    # Its first rows (a prefill chunk of an exact engine) attend through calls of one fixed shape, so that
    # a prompt's keys have the same bits wherever it is cut into chunks (see ``exact_attention.rows``).
    exact_rows: int = 0


@dataclass
class ChunkOut:
    logits: torch.Tensor  # (len(logits_rows), vocab) float32
    keys: list[torch.Tensor]  # per layer (1, kv_heads, t, head_dim): views, copy to keep
    values: list[torch.Tensor]
    inplace: bool  # the keys/values were written into the past's spare capacity
    logprobs: torch.Tensor | None = None  # (t - 1,) float32, for a chunk with ``self_logprobs``


@dataclass
class Prepared:
    """A context resolved against the prefix cache: what is reused, what must still be prefilled."""

    exp: Expanded
    kv: SeqKV | None  # private KV holding the reused prefix (None: nothing reused yet)
    reused: int  # tokens whose KV is in ``kv`` (grows with each committed chunk)
    next_pos: int
    reserve: int = 0  # KV capacity to keep free after the context (candidates, decoded tokens)
    entry: CacheEntry | None = None  # set when the whole context is cached (found, or after prefill)
    last_logits: torch.Tensor | None = None
    cached_tokens: int = -1  # tokens found in the prefix cache (reused before any prefill)

    def __post_init__(self) -> None:
        if self.cached_tokens < 0:
            self.cached_tokens = self.reused

    @property
    def todo(self) -> int:
        return len(self.exp.ids) - self.reused


class ModelRunner:
    def __init__(self, lm: LoadedModel, prefix_cache: PrefixCache, image_cache: ImageCache | None = None,
                 max_context: int | None = None, exact: bool = False) -> None:
        self.lm = lm
        # ``exact``: every row's bits are the same whichever rows share its forward (exact drafts in
        # reduced precision: see ``segments``). A forward of one row gets a second (a copy that attends to
        # itself alone, its outputs dropped): oneDNN multiplies one row by another kernel than two or
        # more (its bf16 down projection, 1,536 deep, rounds some outputs one step apart). Measured on
        # SmolLM2 bf16: 31.9 -> 35.2 ms a decode step (padding each product to two rows instead: 36-39 ms).
        # And prefill chunks attend through exact rows, so that where a prompt is cut into chunks (which
        # pacing decides from measured times) or between cache and prefill changes no key's bits: on a
        # CPU only (elsewhere exact rows are one attention call each, too slow for a prompt's rows).
        self.exact = exact
        self.min_rows = 2 if exact else 1
        self._exact_prefill = exact and lm.device.type == "cpu"
        self.cache = prefix_cache
        self.images = image_cache or ImageCache()
        text = lm.text_config
        self.num_layers = int(text.num_hidden_layers)
        self.kv_heads = int(getattr(text, "num_key_value_heads", None) or text.num_attention_heads)
        self.head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)
        self.vocab_size = int(text.vocab_size)
        limits = [n for n in (max_context, lm.max_positions) if n]
        self.max_context: int | None = min(limits) if limits else None
        self._text_model = getattr(lm.base, "language_model", lm.base)
        # transformers' get_output_embeddings() costs ~0.1 ms a call: once per decode step otherwise
        self._head = lm.lm_head
        # transformers renamed the cache argument (5.19+: ``cache``; ``past_key_values`` warns, and goes
        # in 5.40); the GPU machine's 5.17 knows only the old name.
        params = inspect.signature(lm.base.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        if not segments.uses_segments(self._text_model):
            raise EngineError(f"the model's text decoder must be loaded with attn_implementation="
                              f"{segments.ATTENTION!r} (see loader.attention_for)")

    @property
    def device(self) -> torch.device:
        return self.lm.device

    # ---- the packed forward -------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, chunks: list[Chunk]) -> list[ChunkOut]:
        """All chunks in one row through the linear layers; attention per segment (see segments.py)."""
        if self.min_rows > 1 and sum(len(c.ids) for c in chunks) == 1:
            c = chunks[0]
            return self._forward([c, Chunk(None, list(c.ids), c.pos, [])])[:1]
        return self._forward(chunks)

    def _forward(self, chunks: list[Chunk]) -> list[ChunkOut]:
        lm, dev = self.lm, self.lm.device
        segs = segments.plan(chunks, lm.dtype, dev)
        t_total = segs[-1].end if segs else 0
        ids = torch.tensor([[i for c in chunks for i in c.ids]], dtype=torch.long, device=dev)  # (1, T)
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
        unused_mask = torch.zeros((1, 1, t_total, 1), dtype=lm.dtype, device=dev)
        with segments.segments(self._text_model, segs):
            kwargs[self._cache_arg] = cache
            out = lm.base(input_ids=ids, attention_mask=unused_mask, position_ids=pos, use_cache=True,
                          **kwargs)
        hidden = out.last_hidden_state[0]  # (T, hidden)
        rows: list[int] = []
        o = 0
        for c in chunks:
            rows.extend(o + r for r in c.logits_rows)
            o += len(c.ids)
        if rows == list(range(t_total)):  # every row in order (decode steps): no gather
            logits = self._head(hidden).float()
        elif rows:
            logits = self._head(hidden[torch.tensor(rows, dtype=torch.long, device=dev)]).float()
        else:
            logits = hidden.new_zeros((0, self.vocab_size), dtype=torch.float32)
        own = chunk_logprobs(self._head, chunks, hidden)
        inplace = {s.start + a: s.inplace for s in segs for a, _ in s.bounds}
        results: list[ChunkOut] = []
        o = r = 0
        for c in chunks:
            t, n = len(c.ids), len(c.logits_rows)
            keys, values = cache.new_kv(o, o + t)
            results.append(ChunkOut(logits[r : r + n], keys, values, inplace[o], own.get(o)))
            o += t
            r += n
        return results

    # ---- contexts -----------------------------------------------------------------------------
    def prepare(self, ctx: Context, *, reuse_candidates: bool = False, reserve: int = 0,
                need: int = 0) -> Prepared:
        """Expand ``ctx`` and resolve it against the prefix cache. ``need``: tokens that must still fit
        after the context (the longest candidate, or max_new_tokens): ``ContextTooLong`` otherwise,
        before any work. ``reserve``: KV capacity kept free after the context, so the candidates (or
        the decoded tokens) that follow are written in place instead of copying the context's KV."""
        exp = expand(self.lm, ctx, self.images)
        n_tok = len(exp.ids)
        if not n_tok:
            raise InvalidRequest("empty context")
        if self.max_context is not None and n_tok + need > self.max_context:
            raise ContextTooLong(f"context of {n_tok} tokens (images expanded) + {need} more does not fit "
                                 f"the model's limit of {self.max_context} tokens")
        key = exp.key
        match = self.cache.lookup(key)
        if match is not None and match.length == len(match.entry.key):
            entry = match.entry
            if match.length == n_tok:
                return Prepared(exp, None, n_tok, entry.next_pos, reserve, entry=entry,
                                last_logits=entry.last_logits)
            rest = key[match.length :]
            cand = None
            if reuse_candidates:
                for ck, cv in entry.candidates.items():
                    if rest[: len(ck)] == ck and (cand is None or len(ck) > len(cand[0])):
                        cand = (ck, cv)
            kv = entry.kv.fork(extra=n_tok - match.length + reserve)
            reused, next_pos, last = match.length, entry.next_pos, entry.last_logits
            if cand is not None:
                kv.append(cand[1].keys, cand[1].values)
                reused += len(cand[0])
                next_pos += len(cand[0])
                last = cand[1].last_logits
            return Prepared(exp, kv, reused, next_pos, reserve, last_logits=last)
        if match is not None:
            use = safe_cut(exp, min(match.length, n_tok - 1))
            if use > 0:
                _, next_pos = positions(self.lm, exp, 0, use, 0)
                return Prepared(exp, match.entry.kv.fork(use, extra=n_tok - use + reserve), use, next_pos,
                                reserve)
        return Prepared(exp, None, 0, 0, reserve)

    def prefill_chunk(self, p: Prepared, limit: int | None = None) -> Chunk:
        """The next chunk of ``p``'s prefill: at most ``limit`` tokens, never half an image (an image
        whose pads start the chunk is taken whole, whatever the limit)."""
        start, n = p.reused, len(p.exp.ids)
        end = n if limit is None else min(n, start + max(1, limit))
        if end < n:
            cut = safe_cut(p.exp, end)
            # a chunk that starts with an image larger than the limit takes the image whole
            end = cut if cut > start else next(s1 for s0, s1 in p.exp.image_spans if s0 <= start < s1)
        pos, next_pos = positions(self.lm, p.exp, start, end, p.next_pos)
        pv, grid = images_in(p.exp, start, end)
        rows = [end - start - 1] if end == n else []
        return Chunk(p.kv, p.exp.ids[start:end], pos, rows, pv, grid,
                     past_len=p.kv.length if p.kv is not None else 0, next_pos=next_pos,
                     exact_rows=end - start if self._exact_prefill else 0)

    def commit(self, p: Prepared, chunk: Chunk, out: ChunkOut) -> None:
        """Make ``p``'s private KV hold ``chunk`` after it ran (and the last logits, after the last)."""
        t = len(chunk.ids)
        if p.kv is None:  # the first chunk of a context with nothing reused: room for all of it
            p.kv = SeqKV.empty(self.num_layers, self.kv_heads, self.head_dim, self.lm.dtype,
                               self.lm.device, capacity=len(p.exp.ids) + max(p.reserve, 1))
        if out.inplace:
            p.kv.length += t
        else:
            p.kv.append(out.keys, out.values)
        p.reused += t
        p.next_pos = chunk.next_pos
        if chunk.logits_rows:
            p.last_logits = out.logits[-1]

    def finish_prefill(self, p: Prepared, insert: bool = True) -> CacheEntry:
        """The cache entry of a wholly prefilled context (inserted into the prefix cache)."""
        if p.entry is None:
            if p.kv is None or p.last_logits is None or p.todo:
                raise EngineError("internal: finish_prefill before the context was prefilled")
            p.entry = CacheEntry(p.exp.key, p.kv, p.last_logits, p.next_pos)
            if insert:
                self.cache.insert(p.entry)
        return p.entry

    def prefill(self, preps: list[Prepared], insert: bool = True, chunk_tokens: int | None = None) -> None:
        """Prefill every prepared context that needs it (the scheduler's path, run to completion):
        one forward per round, each holding the next chunk of every unfinished context."""
        while todo := [p for p in preps if p.entry is None and p.todo > 0]:
            chunks = [self.prefill_chunk(p, chunk_tokens) for p in todo]
            for p, c, out in zip(todo, chunks, self.forward(chunks), strict=True):
                self.commit(p, c, out)
        for p in preps:
            if p.entry is None:
                self.finish_prefill(p, insert)

    # ---- scoring ------------------------------------------------------------------------------
    def score_context(self, ctx: Context, candidates: list[list[int]]) -> list[CandidateScore]:
        """Synchronous one-context scoring (benchmarks, tests): resolve, prefill, one packed pass."""
        p = self.prepare(ctx, reserve=sum(len(c) for c in candidates))
        self.prefill([p])
        return self.score([(self.finish_prefill(p), candidates)], cached=[p.cached_tokens])[0]

    def score(self, jobs: list[tuple[CacheEntry, list[list[int]]]],
              cached: Sequence[int] | None = None) -> list[list[CandidateScore]]:
        """Teacher-forced log-probabilities of every job's candidates, all in one forward.

        ``cached[i]``: context tokens of job i found in the prefix cache before this call (default:
        the whole context, i.e. it was prefilled earlier)."""
        return self.score_results(jobs, self.forward(self.score_chunks(jobs)), cached)

    def score_chunks(self, jobs: list[tuple[CacheEntry, list[list[int]]]]) -> list[Chunk]:
        """One chunk per candidate, on its context's cached KV (positions restart after the context)."""
        dims = 3 if self.lm.is_vl else 1
        return [Chunk(e.kv, ids, pos, rows, past_len=e.kv.length, self_logprobs=True)
                for e, ids, pos, rows in score_chunks(jobs, dims, self.device)]

    def fused_score_chunks(self, p: Prepared, candidates: list[list[int]]) -> list[Chunk]:
        """The rest of ``p``'s context (one chunk, whole) followed by one chunk per candidate that sees
        it: prefill and scoring in ONE forward, so that a turn's reasoning costs one forward, not two.
        Needs a reused prefix (``p.kv``): the chunks share it as their past."""
        if p.kv is None or p.entry is not None or not p.todo:
            raise EngineError("internal: fused scoring needs a partly cached, not yet prefilled context")
        rest = self.prefill_chunk(p)
        dims = 3 if self.lm.is_vl else 1
        chunks = [rest]
        for cand in candidates:
            pos = candidate_positions(rest.next_pos, len(cand), dims, self.device)
            chunks.append(Chunk(p.kv, list(cand), pos, [len(cand) - 1], past_len=rest.past_len,
                                sees_first=True, self_logprobs=True))
        return chunks

    def score_results(self, jobs: list[tuple[CacheEntry, list[list[int]]]], outs: list[ChunkOut],
                      cached: Sequence[int] | None = None) -> list[list[CandidateScore]]:
        """Log-probabilities from the outputs of ``score_chunks``; keeps the candidates' KV."""
        results = score_results(jobs, outs, cached, self.device)
        for entry, _ in jobs:
            self.cache.touch(entry)
        return results

    # ---- reference ----------------------------------------------------------------------------
    @torch.inference_mode()
    def naive_score(self, ctx: Context, candidates: list[list[int]]) -> list[CandidateScore]:
        """One plain full forward per candidate through transformers' own path: the reference."""
        exp = expand(self.lm, ctx, self.images)
        n, dev = len(exp.ids), self.device
        pv, grid = images_in(exp, 0, n)
        scores = []
        for cand in candidates:
            ids = torch.tensor([exp.ids + list(cand)], dtype=torch.long, device=dev)
            kwargs: dict[str, Any] = {}
            if pv is not None:
                kwargs = {"pixel_values": pv, "image_grid_thw": grid,
                          "mm_token_type_ids": torch.eq(ids, self.lm.image_token_id or -1).int()}
            # logits only where they are needed (the last K + 1 rows, the last dropped): a fair baseline
            k = len(cand)
            logits = self.lm.model(input_ids=ids, use_cache=False, logits_to_keep=k + 1,
                                   **kwargs).logits[0].float()
            lp = torch.log_softmax(logits[:k], dim=-1)
            lp = lp.gather(1, torch.tensor(cand, dtype=torch.long, device=dev).view(-1, 1))[:, 0]
            scores.append(CandidateScore(tuple(float(x) for x in lp.tolist())))
        return scores

"""The scheduler's side of drafts: where they go in a forward, and what a generation keeps of them.

A decode step feeds the token just chosen and its draft (``speculate.chains``: one chain, or a tree of
them side by side in the step's chunk); a generation's first draft rides in its prompt's last prefill
chunk, after the prompt (what a tool call's grammar forces at its start, say), so that a wholly forced
action needs no decode forward at all. After the forward, ``keep`` verifies the draft
(``Decoder.verify``: the same choice one-token decoding makes) and moves the generation past the fed
tokens and the kept part of the draft; the keys of a rejected rest lie past the KV's ``length`` and are
overwritten by later steps. ``keep_tree`` does the same for the chain the step chose, moving its keys
up to follow the fed token. ``learn`` keeps how each grammar's generations end, for the next ones.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

from ssr_server.core.protocol import Generation
from ssr_server.engine.torch import speculate
from ssr_server.engine.torch.decode import Decoder
from ssr_server.engine.torch.jobs import GenerateJob, Seq
from ssr_server.engine.torch.runner import Chunk, ChunkOut
from ssr_server.engine.torch.speculate import DraftConfig, TokenHistory

log = logging.getLogger(__name__)


MAX_ENDINGS = 64  # grammars whose last ending is kept (tool schemas: a handful per deployment)
RELEARN = 16  # an ending is learnt again every this many completions of its grammar (cheap, not free)


class Drafter:
    def __init__(self, config: DraftConfig, batch_tokens: int, decoder: Decoder, vocab_size: int) -> None:
        self.config = config
        self.batch_tokens = batch_tokens  # draft tokens per forward, all generations together
        self.decoder = decoder
        self.vocab_size = vocab_size
        # id(compiled grammar) -> (it, how its last learnt generation ended, completions since); the
        # grammar object is held so that its id is not reused while its entry is here
        self._endings: OrderedDict[int, tuple[Any, list[int], int]] = OrderedDict()

    def budget(self) -> int:
        """Draft tokens one forward may carry."""
        return self.batch_tokens if self.config.enabled else 0

    def history(self, key: Sequence[int]) -> TokenHistory:
        return TokenHistory(key if self.config.prompt_lookup else ())

    def for_step(self, seq: Seq, tok: int, depth: int, rows: int) -> list[list[int]]:
        """The draft to feed after ``tok`` (already taken by ``seq``), as chains (``speculate.chains``):
        at most ``depth`` tokens deep, ``rows`` tokens in all."""
        if self.config.exact:
            rows = min(rows, seq.draft_limit)
        if depth <= 0 or rows <= 0:
            return []
        t0 = time.perf_counter()
        grammar = seq.job.grammar
        ending = self._endings.get(id(grammar.compiled), (None, [], 0))[1] if grammar is not None else []
        try:
            chains = speculate.chains(grammar, seq.history, [tok], self.config, depth, rows, self.vocab_size,
                                      self.decoder, ending)
            return chains[:1] if self.config.exact else chains
        except Exception:  # a draft is only ever an optimisation: never fail a job over one
            log.exception("drafting failed; decoding on without a draft")
            return []
        finally:
            seq.stats.draft_s += time.perf_counter() - t0

    def learn(self, seq: Seq) -> None:
        """Remember how a generation that completed its grammar ended (``speculate.ending_of``)."""
        grammar = seq.job.grammar
        if not self.config.enabled or grammar is None or not grammar.complete or not seq.generated:
            return
        key = id(grammar.compiled)
        _, known, since = self._endings.get(key, (None, [], RELEARN))
        if since + 1 < RELEARN:
            self._endings[key] = (grammar.compiled, known, since + 1)
            return
        try:
            ending = speculate.ending_of(grammar, seq.generated)
        except Exception:  # only ever an optimisation
            log.exception("learning a grammar's ending failed")
            return
        self._endings[key] = (grammar.compiled, ending or known, 0)
        self._endings.move_to_end(key)
        if len(self._endings) > MAX_ENDINGS:
            self._endings.popitem(last=False)

    def into_prompt(self, job: GenerateJob, chunk: Chunk, room: int) -> Chunk:
        """``chunk`` (the last of ``job``'s prompt) with the draft of its first tokens after it."""
        if not self.config.enabled or room <= 0 or not chunk.logits_rows or chunk.pixel_values is not None:
            return chunk  # not the prompt's last chunk, or one with an image (positions not text's)
        assert job.prep is not None
        try:
            draft = speculate.draft(job.grammar, self.history(job.prep.exp.key), [], self.config,
                                    min(room, job.params.max_new_tokens - 1), self.vocab_size, self.decoder)
        except Exception:
            log.exception("drafting failed; prefilling without a draft")
            return chunk
        if not draft:
            return chunk
        n = len(chunk.ids)
        extra = torch.arange(chunk.next_pos, chunk.next_pos + len(draft), dtype=torch.long,
                             device=chunk.pos.device).expand(chunk.pos.shape[0], len(draft))
        job.draft = draft
        return dataclasses.replace(chunk, ids=[*chunk.ids, *draft], pos=torch.cat([chunk.pos, extra], dim=1),
                                   logits_rows=[n - 1, *range(n, n + len(draft))],
                                   alone_from=n if self.config.exact else None)

    @staticmethod
    def split_prompt(job: GenerateJob, chunk: Chunk, out: ChunkOut) -> tuple[Chunk, ChunkOut, list[int]]:
        """The prompt's part of a chunk that carried a draft (committed like any prefill chunk), and the
        draft, which waits for its verification (``keep`` with the whole output)."""
        draft, job.draft = job.draft, []
        if not draft:
            return chunk, out, []
        n = len(chunk.ids) - len(draft)
        chunk = dataclasses.replace(chunk, ids=chunk.ids[:n], pos=chunk.pos[:, :n], logits_rows=[n - 1])
        part = ChunkOut(out.logits[:1], [k[:, :, :n] for k in out.keys], [v[:, :, :n] for v in out.values],
                        out.inplace)
        return chunk, part, draft

    def step_chunk(self, seq: Seq, tok: int, chains: list[list[int]], dims: int) -> Chunk:
        """A decode step's chunk: the fed token and its linear draft; or, for a tree draft, the fed token
        and its chains side by side (``Chunk.branches``), each chain's positions following the token."""
        dev = seq.kv.keys[0].device
        if len(chains) <= 1:
            ids = [tok, *(chains[0] if chains else [])]
            pos = torch.arange(seq.next_pos, seq.next_pos + len(ids), dtype=torch.long,
                               device=dev).expand(dims, len(ids))
            return Chunk(seq.kv, ids, pos, list(range(len(ids))), past_len=seq.kv.length,
                         alone_from=0 if self.config.exact else None)
        steps = [0] + [i + 1 for c in chains for i in range(len(c))]
        pos = (torch.tensor(steps, dtype=torch.long, device=dev) + seq.next_pos).expand(dims, len(steps))
        ids = [tok, *(t for c in chains for t in c)]
        return Chunk(seq.kv, ids, pos, list(range(len(ids))), past_len=seq.kv.length,
                     branches=[len(c) for c in chains])

    def keep_step(self, seq: Seq, chunk: Chunk, out: ChunkOut) -> Generation | None:
        """After a decode step's forward: ``keep`` or ``keep_tree``, as the step's chunk was built."""
        if chunk.branches:
            return self.keep_tree(seq, chunk.ids, chunk.branches, out)
        return self.keep(seq, chunk.ids[:1], chunk.ids[1:], out)

    def keep_tree(self, seq: Seq, ids: list[int], branches: list[int], out: ChunkOut) -> Generation | None:
        """``keep`` for a tree draft: ``ids`` is the fed token, then chains of lengths ``branches``."""
        starts = [1 + sum(branches[:i]) for i in range(len(branches))]
        chains = [ids[a : a + n] for a, n in zip(starts, branches, strict=True)]
        j, kept, result = self.decoder.verify_tree(seq, out.logits[0], chains,
                                                   [out.logits[a : a + n] for a, n in zip(starts, branches,
                                                                                          strict=True)])
        seq.stats.drafted += len(ids) - 1
        seq.stats.accepted += kept
        seq.stats.trees += 1
        if result is not None:  # the last kept token ended it: unfed, as one-token decoding leaves it
            kept -= 1
        src = starts[j] if j >= 0 else 1
        kv, n = seq.kv, seq.kv.length
        if out.inplace:  # the step's rows lie after the KV: the fed token, then each chain in order
            if kept and src != 1:  # the kept chain moves up, right after the fed token
                with torch.inference_mode():  # the buffers may have been (re)made inside a forward
                    for buf in (*kv.keys, *kv.values):
                        buf[:, :, n + 1 : n + 1 + kept] = buf[:, :, n + src : n + src + kept].clone()
            kv.length += 1 + kept
        else:
            kv.append([k[:, :, :1] for k in out.keys], [v[:, :, :1] for v in out.values])
            if kept:
                kv.append([k[:, :, src : src + kept] for k in out.keys],
                          [v[:, :, src : src + kept] for v in out.values])
        after = out.logits[src + kept - 1] if kept else out.logits[0]
        self._advance(seq, ids[:1] + ids[src : src + kept], after)
        return result

    def keep(self, seq: Seq, fed: list[int], draft: list[int], out: ChunkOut, offset: int = 0,
             ) -> Generation | None:
        """Verify ``draft`` and move ``seq`` past ``fed`` (taken already) and the kept part of the
        draft. ``out``: the forward's output for the chunk, whose rows ``offset`` on hold ``fed`` then
        the draft; ``out.logits`` has one row per draft token and one after the last. Returns the
        result if a kept token ended the generation."""
        kept, result = self.decoder.verify(seq, draft, out.logits)
        seq.stats.drafted += len(draft)
        seq.stats.accepted += kept
        self._back_off(seq, len(draft), kept)
        if result is not None:  # the last kept token ended it: unfed, as one-token decoding leaves it
            kept -= 1
        new = [*fed, *draft[:kept]]
        if out.inplace:  # written right after the generation's KV, in its spare room
            seq.kv.length += len(new)
        elif new:
            end = offset + len(new)
            seq.kv.append([k[:, :, offset:end] for k in out.keys], [v[:, :, offset:end] for v in out.values])
        self._advance(seq, new, out.logits[kept])
        return result

    def _back_off(self, seq: Seq, drafted: int, kept: int) -> None:
        if self.config.exact and drafted:
            if kept == 0:
                seq.draft_limit = max(1, min(seq.draft_limit, drafted) // 2)
            elif kept == drafted:
                seq.draft_limit = min(2 * seq.draft_limit, self.config.max_tokens)

    def _advance(self, seq: Seq, new: list[int], logits: torch.Tensor) -> None:
        """``seq`` past ``new`` (its KV already holds them), with the distribution that follows."""
        seq.key.extend(new)
        if self.config.prompt_lookup:
            seq.history.extend(new)
        seq.next_pos += len(new)
        seq.logits = logits

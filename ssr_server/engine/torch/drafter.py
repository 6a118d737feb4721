"""The scheduler's side of drafts: where they go in a forward, and what a generation keeps of them.

A decode step feeds the token just chosen and its draft (``speculate.draft``); a generation's first
draft rides in its prompt's last prefill chunk, after the prompt (what a tool call's grammar forces at
its start, say), so that a wholly forced action needs no decode forward at all. After the forward,
``keep`` verifies the draft (``Decoder.verify``: the same choice one-token decoding makes) and moves
the generation past the fed tokens and the kept part of the draft; the keys of a rejected rest lie past
the KV's ``length`` and are overwritten by later steps.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence

import torch

from ssr_server.core.protocol import Generation
from ssr_server.engine.torch import speculate
from ssr_server.engine.torch.decode import Decoder
from ssr_server.engine.torch.jobs import GenerateJob, Seq
from ssr_server.engine.torch.runner import Chunk, ChunkOut
from ssr_server.engine.torch.speculate import DraftConfig, TokenHistory

log = logging.getLogger(__name__)


class Drafter:
    def __init__(self, config: DraftConfig, batch_tokens: int, decoder: Decoder, vocab_size: int) -> None:
        self.config = config
        self.batch_tokens = batch_tokens  # draft tokens per forward, all generations together
        self.decoder = decoder
        self.vocab_size = vocab_size

    def budget(self) -> int:
        """Draft tokens one forward may carry."""
        return self.batch_tokens if self.config.enabled else 0

    def history(self, key: Sequence[int]) -> TokenHistory:
        return TokenHistory(key if self.config.prompt_lookup else ())

    def for_step(self, seq: Seq, tok: int, room: int) -> list[int]:
        """The draft to feed after ``tok`` (already taken by ``seq``): at most ``room`` tokens."""
        if room <= 0:
            return []
        t0 = time.perf_counter()
        try:
            return speculate.draft(seq.job.grammar, seq.history, [tok], self.config, room, self.vocab_size,
                                   self.decoder)
        except Exception:  # a draft is only ever an optimisation: never fail a job over one
            log.exception("drafting failed; decoding on without a draft")
            return []
        finally:
            seq.stats.draft_s += time.perf_counter() - t0

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
                                   logits_rows=[n - 1, *range(n, n + len(draft))])

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

    def keep(self, seq: Seq, fed: list[int], draft: list[int], out: ChunkOut, offset: int = 0,
             ) -> Generation | None:
        """Verify ``draft`` and move ``seq`` past ``fed`` (taken already) and the kept part of the
        draft. ``out``: the forward's output for the chunk, whose rows ``offset`` on hold ``fed`` then
        the draft; ``out.logits`` has one row per draft token and one after the last. Returns the
        result if a kept token ended the generation."""
        kept, result = self.decoder.verify(seq, draft, out.logits)
        seq.stats.drafted += len(draft)
        seq.stats.accepted += kept
        new = [*fed, *draft[:kept]]
        if out.inplace:  # written right after the generation's KV, in its spare room
            seq.kv.length += len(new)
        elif new:
            end = offset + len(new)
            seq.kv.append([k[:, :, offset:end] for k in out.keys], [v[:, :, offset:end] for v in out.values])
        seq.key.extend(new)
        if self.config.prompt_lookup:
            seq.history.extend(new)
        seq.next_pos += len(new)
        seq.logits = out.logits[kept]
        return result

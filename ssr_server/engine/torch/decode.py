"""One decode step of a running generation: next token (grammar mask, sampling), the verification of
the draft fed after it, and whether the generation ends there.

A generation ends at end-of-sequence (unless ``ignore_eos``), at a stop string, when its grammar's
text is complete (only end-of-sequence allowed: checked right after the token is accepted, so no
forward is spent on the end token), or at ``max_new_tokens``.
"""

from __future__ import annotations

import time

import torch

from ssr_server.core.errors import EngineError
from ssr_server.core.protocol import FinishReason, Generation
from ssr_server.engine.stop import find_stop
from ssr_server.engine.torch.jobs import Seq


class Decoder:
    def __init__(self, tokenizer: object, eos_ids: frozenset[int]) -> None:
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self._pieces: dict[int, str] = {}  # token id -> its text alone (stop-string pre-check)
        self._spelled: dict[str, list[int]] = {}

    def _decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))  # type: ignore[attr-defined]

    def decode(self, ids: list[int]) -> str:
        return self._decode(ids)

    def encode(self, text: str) -> list[int]:
        """``text`` as the tokenizer spells it (forced grammar text: a few strings, over and over)."""
        hit = self._spelled.get(text)
        if hit is None:
            tok = self.tokenizer
            hit = self._spelled[text] = list(tok.encode(text, add_special_tokens=False))  # type: ignore[attr-defined]
            if len(self._spelled) > 4096:
                self._spelled.clear()
        return hit

    def choose(self, seq: Seq, logits: torch.Tensor, best: int | None = None) -> int:
        """The token ``seq`` takes after ``logits`` (masked by its grammar, in its current state).
        ``best``: the unmasked argmax of ``logits`` when the caller has it (greedy sequences)."""
        grammar = seq.job.grammar
        if seq.sampler.greedy:
            # The unmasked argmax, when the grammar admits it, IS the masked argmax (the first maximum
            # among the admitted tokens: an admitted token before it with the same value would have
            # been the unmasked argmax). Most steps end here, without a copy and a mask of the logits.
            t0 = time.perf_counter()
            if best is None:
                best = int(torch.argmax(logits))
            ok = grammar is None or grammar.allows(best)
            seq.stats.sample_s += time.perf_counter() - t0
            if ok:
                return best
        if grammar is not None:  # on a copy: the unmasked logits may be cached with the sequence
            t0 = time.perf_counter()
            logits = logits.clone()
            grammar.mask(logits)
            seq.stats.grammar_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        tok = seq.sampler(logits)
        seq.stats.sample_s += time.perf_counter() - t0
        return tok

    def take(self, seq: Seq, tok: int) -> None:
        """Record ``tok`` as ``seq``'s next token (advancing its grammar)."""
        grammar = seq.job.grammar
        if grammar is not None:
            t0 = time.perf_counter()
            ok = grammar.accept(tok)
            seq.stats.grammar_s += time.perf_counter() - t0
            if not ok:
                raise EngineError(f"the grammar rejected sampled token {tok}")
        seq.generated.append(tok)

    def next_token(self, seq: Seq) -> int:
        """``seq``'s next token: the one its last verification chose, or one chosen from its logits."""
        tok = seq.pending if seq.pending is not None else self.choose(seq, seq.logits)
        seq.pending = None
        self.take(seq, tok)
        return tok

    def verify(self, seq: Seq, draft: list[int], logits: torch.Tensor) -> tuple[int, Generation | None]:
        """Keep the longest prefix of ``draft`` that ``seq`` would have chosen itself. ``logits[i]``:
        the distribution after the fed token before ``draft[i]`` (one row more than the draft). Each
        choice is made exactly as one-token decoding makes it (same mask, same sampler, same draw):
        the first one that differs from the draft becomes ``seq.pending``, the next step's token.
        Returns the tokens kept and the result if one of them ended the generation."""
        best: list[int] | list[None] = [None] * len(draft)
        if draft and seq.sampler.greedy:  # every row's argmax in one op
            best = torch.argmax(logits[: len(draft)], dim=-1).tolist()
        for i, tok in enumerate(draft):
            chosen = self.choose(seq, logits[i], best[i])
            if chosen != tok:
                seq.pending = chosen
                return i, None
            self.take(seq, tok)
            result = self.finished(seq)
            if result is not None:
                return i + 1, result
        return len(draft), None

    def verify_tree(self, seq: Seq, first: torch.Tensor, chains: list[list[int]],
                    rows: list[torch.Tensor]) -> tuple[int, int, Generation | None]:
        """``verify`` for a tree draft: ``first`` is the distribution after the fed token, ``chains``
        start with distinct tokens, ``rows[j][i]`` is the distribution after ``chains[j][i]``. The
        token chosen from ``first`` picks the chain (none: it becomes ``seq.pending``), whose rest is
        verified as a linear draft. Returns the chain (-1: none), its tokens kept and the result."""
        tok = self.choose(seq, first)
        j = next((k for k, c in enumerate(chains) if c[0] == tok), -1)
        if j < 0:
            seq.pending = tok
            return -1, 0, None
        self.take(seq, tok)
        result = self.finished(seq)
        if result is not None:
            return j, 1, result
        kept, result = self.verify(seq, chains[j][1:], rows[j])
        return j, kept + 1, result

    def finished(self, seq: Seq) -> Generation | None:
        """The result when the newest token ends the generation, else None."""
        t0 = time.perf_counter()
        try:
            return self._finished(seq)
        finally:
            seq.stats.detok_s += time.perf_counter() - t0

    def _finished(self, seq: Seq) -> Generation | None:
        params = seq.job.params
        tok = seq.generated[-1]
        grammar = seq.job.grammar
        reason: FinishReason | None = None
        stop_text: str | None = None
        text = ""
        cut = 0
        if grammar is not None and grammar.complete:
            if tok in grammar.stop_ids:
                seq.generated.pop()  # the end token is not returned (and was never fed)
            reason = "stop"
            text = self._decode(seq.generated)
            cut = len(text)
        elif tok in self.eos_ids and not params.ignore_eos:
            reason = "eos"
            text = self._decode(seq.generated[:-1])
            cut = len(text)
        elif params.stop and self._tail_has_stop(seq.generated, params.stop):
            # Only the tail is decoded each step; the whole text once, when a stop string showed up.
            text = self._decode(seq.generated)
            hit = find_stop(text, params.stop)
            if hit is not None:
                reason, cut, stop_text = "stop", hit[0], hit[1]
        if reason is None and len(seq.generated) >= params.max_new_tokens:
            reason = "length"
            text = self._decode(seq.generated)
            cut = len(text)
        if reason is None:
            return None
        elapsed = time.perf_counter() - seq.started
        return Generation(
            token_ids=tuple(seq.generated), text=text[:cut], finish_reason=reason,
            prompt_tokens=seq.prompt_tokens, cached_tokens=seq.cached_tokens, elapsed_s=elapsed,
            stop_text=stop_text, forwards=seq.stats.forwards,
            timings={"queue_s": seq.job.admitted - seq.job.submitted,
                     "prefill_s": seq.started - seq.job.admitted, "generate_s": elapsed,
                     **seq.stats.timings()},
        )

    def _piece(self, tok: int) -> str:
        piece = self._pieces.get(tok)
        if piece is None:
            piece = self._pieces[tok] = self._decode([tok])
        return piece

    def _tail_has_stop(self, generated: list[int], stops: tuple[str, ...]) -> bool:
        # A stop string that ended with the newest token ends with a character of that token's text,
        # so most steps are settled by a dict lookup; a token holding part of a multi-byte character
        # decodes to U+FFFD on its own and always gets the full check, as do stops ending in white
        # space (some tokenizers drop a token's leading space when it is decoded alone).
        piece = self._piece(generated[-1])
        quick = all(s and not s[-1].isspace() for s in stops) and "\ufffd" not in piece
        if quick and not any(s[-1] in piece for s in stops):
            return False
        # Every token holds at least one byte, so a stop string that ended with the newest token lies
        # within its last len(stop in bytes) + 4 tokens.
        n = max(len(s.encode()) for s in stops) + 4
        return find_stop(self._decode(generated[-n:]), stops) is not None

"""One decode step of a running generation: next token (grammar mask, sampling) and whether it ends there.

A generation ends at end-of-sequence (unless ``ignore_eos``), at a stop string, when its grammar's
text is complete (only end-of-sequence allowed: checked right after the token is accepted, so no
forward is spent on the end token), or at ``max_new_tokens``.
"""

from __future__ import annotations

import time

from ssr_server.core.errors import EngineError
from ssr_server.core.protocol import FinishReason, Generation
from ssr_server.engine.stop import find_stop
from ssr_server.engine.torch.jobs import Seq


class Decoder:
    def __init__(self, tokenizer: object, eos_ids: frozenset[int]) -> None:
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self._pieces: dict[int, str] = {}  # token id -> its text alone (stop-string pre-check)

    def _decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))  # type: ignore[attr-defined]

    def next_token(self, seq: Seq) -> int:
        """Sample ``seq``'s next token from its logits (masked by its grammar) and record it."""
        grammar = seq.job.grammar
        logits = seq.logits
        if grammar is not None:  # on a copy: the unmasked logits may be cached with the sequence
            logits = logits.clone()
            grammar.mask(logits)
        tok = seq.sampler(logits)
        if grammar is not None and not grammar.accept(tok):
            raise EngineError(f"the grammar rejected sampled token {tok}")
        seq.generated.append(tok)
        return tok

    def finished(self, seq: Seq) -> Generation | None:
        """The result when the newest token ends the generation, else None."""
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
            stop_text=stop_text,
            timings={"queue_s": seq.started - seq.job.submitted, "generate_s": elapsed},
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

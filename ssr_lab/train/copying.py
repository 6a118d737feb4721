"""A synthetic copying task that teaches a fresh model to copy before SFT asks it to.

The agent's hard tokens are copies: the entity's name from the question or the image-search title into
the query, the answer's span from a search hit into ``<answer>``. A copy is done by an induction circuit
(a previous-token head feeding a head that attends to what followed the earlier occurrence of the current
token), and SFT alone does not grow one: a trajectory holds three or four copied tokens among hundreds
that are learnt by heart.

A row is a span of random ordinary token ids, random filler, then the span again; the loss is on the
repeat, where every token is predictable only by induction. Lengths follow a curriculum: the first
rows have one length (a span of 24 after a filler of 40), and the ranges widen to spans of 16-32 after
fillers of 16-48. Measured in `train sft` on a fresh 128x4-tied model (lr 3e-3, 32 rows a step): with
an 800-step warm-up the loss stayed at chance (~8) until step ~700, was 5.4 at step 800 and ~0.5 by
step 1,600 with one copying step in four; with a 300-step warm-up it was still ~7.5 at step 450 (the
widening was then too quick). One fixed length can be solved by position rather than by induction,
which is why the lengths widen instead of staying fixed. The ids are
uniform over the vocabulary, so every embedding - the pieces of names that only the test split uses
included - is trained to be copied. Text only, positions 0..T-1 on the three M-RoPE axes (as text
positions are).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class CopyTask:
    vocab: int  # ids in [0, vocab) are ordinary BPE tokens (the special and added ones come after)
    span: tuple[int, int] = (16, 32)  # repeated span length, inclusive bounds, once widened
    filler: tuple[int, int] = (16, 48)
    start_span: int = 24  # the first rows' lengths, the ranges widen from
    start_filler: int = 40

    @classmethod
    def for_tokenizer(cls, tok: Any) -> CopyTask:
        added = set(tok.get_added_vocab().values())
        vocab = min(added) if added else len(tok)
        return cls(vocab=int(vocab))

    def ranges(self, widened: float) -> tuple[tuple[int, int], tuple[int, int]]:
        """The span and filler ranges ``widened`` (0..1) of the way from the start lengths to the full."""
        w = min(max(widened, 0.0), 1.0)

        def between(start: int, lo: int, hi: int) -> tuple[int, int]:
            return round(start - (start - lo) * w), round(start + (hi - start) * w)

        return between(self.start_span, *self.span), between(self.start_filler, *self.filler)

    def rows(self, batch: int, generator: torch.Generator,
             widened: float = 1.0) -> tuple[torch.Tensor, int, int]:
        """(ids (B, 2L + F), L, F): each row ``span, filler, span``; one L and F per batch (no padding)."""
        (s_lo, s_hi), (f_lo, f_hi) = self.ranges(widened)
        n = int(torch.randint(s_lo, s_hi + 1, (1,), generator=generator))
        f = int(torch.randint(f_lo, f_hi + 1, (1,), generator=generator))
        span = torch.randint(0, self.vocab, (batch, n), generator=generator)
        fill = torch.randint(0, self.vocab, (batch, f), generator=generator)
        return torch.cat([span, fill, span], dim=1), n, f


def copy_loss(model: Any, task: CopyTask, batch: int, generator: torch.Generator,
              widened: float = 1.0) -> tuple[torch.Tensor, int]:
    """Mean cross-entropy over the repeated span (its first token excluded: it follows the filler, not
    the span), and the number of tokens run."""
    ids, n, f = task.rows(batch, generator, widened)
    ids = ids.to(model.device)
    t = ids.shape[1]
    positions = torch.arange(t, device=model.device).view(1, 1, t).expand(3, batch, t)
    hidden = model.model.language_model(input_ids=ids, position_ids=positions).last_hidden_state  # (B, T, H)
    start = n + f  # the repeat's first token; predicted from the hidden state just before it
    logits = model.lm_head(hidden[:, start : t - 1]).float()  # (B, n - 1, V)
    targets = ids[:, start + 1 :]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return loss, batch * t

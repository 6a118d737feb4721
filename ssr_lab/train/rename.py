"""Renaming augmentation for SFT: each time an example is drawn, its entity gets a fresh invented name.

A tiny model trained on the oracle trajectories as they are learns the training entities' names (each
recurs in several questions, and a sixth of them are single tokens) instead of copying the name it reads
in the question or a search result into its query or answer; at test time, where every name is new, it
then writes a remembered name whatever the question. Replacing the entity's stem with a fresh word per
draw, consistently everywhere in the trajectory (question, observations, URLs in lower case, the query
the assistant writes), leaves copying as the only way to predict the assistant's name tokens.

Works on the compact token ids: the project's tokenizers keep words apart from spaces and punctuation,
so a word's tokens are the same wherever it stands (``stem_tokens`` checks that, per stem, by encoding
it inside a sentence). Positions are computed at collation, so the new name may have another length.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ssr_lab.train.data import Example
from ssr_lab.world.names import make_word
from ssr_lab.world.records import Question


@dataclass(frozen=True)
class StemTokens:
    cased: tuple[int, ...]  # "Zemclinard"
    lower: tuple[int, ...]  # "zemclinard" (URLs)


def _word_tokens(tok: Any, word: str) -> tuple[int, ...] | None:
    """The word's tokens, or None when the tokenizer would not keep them the same inside text."""
    alone = tuple(tok.encode(word, add_special_tokens=False))
    inside = tuple(tok.encode(f'Who is "{word} x"? The {word}, {word}-x.', add_special_tokens=False))
    count = sum(1 for i in range(len(inside)) if inside[i : i + len(alone)] == alone)
    return alone if alone and count == 3 else None


def stem_tokens(tok: Any, stem: str) -> StemTokens | None:
    cased, lower = _word_tokens(tok, stem), _word_tokens(tok, stem.lower())
    return StemTokens(cased, lower) if cased and lower else None


def question_stems(questions: Sequence[Question]) -> dict[str, str]:
    """Question id -> the invented stem of its entity ("Zemclinard" of "Zemclinard soup"); the
    well-known entities (ids ``k-...``) keep their names: their facts are remembered, not looked up."""
    return {q.id: q.entity.split()[0] for q in questions
            if q.entity and not q.entity_id.startswith("k-")}


def _replace(ids: Sequence[int], mask: Sequence[bool], old: tuple[int, ...], new: tuple[int, ...],
             ) -> tuple[list[int], list[bool]]:
    out_ids: list[int] = []
    out_mask: list[bool] = []
    i, n, k = 0, len(ids), len(old)
    first = old[0]
    while i < n:
        if ids[i] == first and tuple(ids[i : i + k]) == old:
            out_ids.extend(new)
            out_mask.extend([mask[i]] * len(new))
            i += k
        else:
            out_ids.append(ids[i])
            out_mask.append(mask[i])
            i += 1
    return out_ids, out_mask


def renamed_example(ex: Example, old: StemTokens, new: StemTokens) -> Example:
    """``ex`` with every occurrence of the ``old`` stem's tokens (cased and lower case) replaced."""
    ids, mask = _replace(ex.ids, ex.mask, old.cased, new.cased)
    ids, mask = _replace(ids, mask, old.lower, new.lower)
    return Example(ex.key, ex.kind, tuple(ids), tuple(mask), ex.images)


class Renamer:
    """Gives each drawn example a fresh name for its entity (deterministic for the given ``rng``)."""

    def __init__(self, tok: Any, questions: Sequence[Question]) -> None:
        self.tok = tok
        self.stems: dict[str, StemTokens] = {}
        for qid, stem in question_stems(questions).items():
            st = stem_tokens(tok, stem)
            if st is not None:
                self.stems[qid] = st
        self._taken = {q.entity.split()[0].lower() for q in questions if q.entity}

    def fresh(self, rng: random.Random) -> StemTokens:
        while True:
            word = make_word(rng, rng.choice((2, 2, 3)))
            if word.lower() in self._taken:
                continue
            st = stem_tokens(self.tok, word)
            if st is not None:
                return st

    def __call__(self, examples: Sequence[Example], rng: random.Random) -> list[Example]:
        out = []
        for ex in examples:
            old = self.stems.get(ex.key.split("/", 1)[0])
            out.append(ex if old is None else renamed_example(ex, old, self.fresh(rng)))
        return out

"""Drills for SFT: short excerpts of the oracle trajectories that keep only the turns that copy.

What our tiny models fail at is copying a name or an answer into the action: the first piece of the
entity's name into the text-search query, the answer's span from the top search hit into ``<answer>``
(README, Training: 96-97% of the assistant's tokens are learnt, these are not). A full trajectory spends
most of its compute on the 1,800-token system prompt, the images and turns that teach nothing new, and
holds one or two copies. A drill is the same tokens cut down to what a copy needs, text only:

- an answer drill: the question, the call that fetched the evidence, its (text) result, the answer turn;
- a query drill: the question and the turns up to a text-search call, the call itself; one per call, so
  a two-hop trajectory's second call (the person's name copied from the first result, and the attribute
  the question asks about: "born" for "In which year ...", "birthplace" for "In which town ...") is
  drilled too, a choice R2 got wrong on most year questions (README, Training).

No system prompt and no images (the question's picture and the thumbnails are dropped, their text
stays), so a drill costs about a sixth of a trajectory; only the copying turn is in the loss (the call of
an answer drill too when it follows the question directly: then nothing it copies from was dropped).
Used with ``rename``, every drill copies a name it cannot have memorised.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ssr_lab.train.data import Example
from ssr_server.core.formats.format import PromptFormat


@dataclass(frozen=True)
class DrillTokens:
    turn: int  # <|im_start|>
    vision_start: int
    vision_end: int
    answer: tuple[int, ...]  # the answer's opening tag
    text_search: tuple[int, ...]  # the text-search tool's advertised name

    @classmethod
    def of(cls, tok: Any, fmt: PromptFormat) -> DrillTokens:
        def one(token: str) -> int:
            return int(tok.convert_tokens_to_ids(token))

        def enc(text: str) -> tuple[int, ...]:
            return tuple(tok.encode(text, add_special_tokens=False))

        return cls(one(fmt.chat.open.split("{", 1)[0]), one("<|vision_start|>"), one("<|vision_end|>"),
                   enc(fmt.actions.answer.open), enc(fmt.tool_names["text_search"]))


def _turns(ids: Sequence[int], turn: int) -> list[tuple[int, int]]:
    starts = [i for i, t in enumerate(ids) if t == turn] + [len(ids)]
    return list(itertools.pairwise(starts))


def _holds(ids: Sequence[int], part: tuple[int, ...]) -> bool:
    k = len(part)
    return any(tuple(ids[i : i + k]) == part for i in range(len(ids) - k + 1))


def _text_only(ids: Sequence[int], t: DrillTokens) -> list[int]:
    out: list[int] = []
    inside = False
    for tok in ids:
        if tok == t.vision_start:
            inside = True
        elif tok == t.vision_end:
            inside = False
        elif not inside:
            out.append(tok)
    return out


def _drill(ex: Example, spans: Sequence[tuple[int, int, bool]], t: DrillTokens) -> Example:
    """The excerpt of ``spans`` (start, end, keep the loss), images dropped from the unpredicted ones."""
    ids: list[int] = []
    mask: list[bool] = []
    for a, b, loss in spans:
        if loss:
            ids += ex.ids[a:b]
            mask += ex.mask[a:b]
        else:
            text = _text_only(ex.ids[a:b], t)
            ids += text
            mask += [False] * len(text)
    return Example(ex.key, ex.kind, tuple(ids), tuple(mask), ())


def answer_drill(ex: Example, t: DrillTokens) -> Example | None:
    """Question + evidence call + its result + the answer; None when the trajectory does not end by
    answering from a text-only result."""
    turns = _turns(ex.ids, t.turn)
    if len(turns) < 5:  # system, question, call, result, answer
        return None
    call, result, last = turns[-3], turns[-2], turns[-1]
    if not _holds(ex.ids[last[0] : last[1]], t.answer) or t.vision_start in ex.ids[result[0] : result[1]]:
        return None
    return _drill(ex, [(*turns[1], False), (*call, call == turns[2]), (*result, False), (*last, True)], t)


def query_drills(ex: Example, t: DrillTokens, every_call: bool = True) -> list[Example]:
    """For each text-search call (or only the first): the question and the turns before it, the call in
    the loss."""
    turns = _turns(ex.ids, t.turn)
    calls = [k for k, (a, b) in enumerate(turns)
             if k >= 2 and any(ex.mask[a:b]) and _holds(ex.ids[a:b], t.text_search)]
    calls = calls if every_call else calls[:1]
    return [_drill(ex, [(*span, False) for span in turns[1:k]] + [(*turns[k], True)], t) for k in calls]


@dataclass(frozen=True)
class Drills:
    answers: list[Example]
    queries: list[Example]

    @classmethod
    def of(cls, examples: Sequence[Example], t: DrillTokens, every_call: bool = True) -> Drills:
        """``every_call=False``: only each trajectory's first text search (what models up to the shipped
        R2 were trained with, so that their cards' commands still make them)."""
        answers = [d for e in examples if (d := answer_drill(e, t)) is not None]
        queries = [d for e in examples for d in query_drills(e, t, every_call)]
        return cls(answers, queries)

    def interleave(self, full: Sequence[list[Example]], batch_size: int, rng: random.Random,
                   sizes: tuple[int, int] = (2, 4)) -> list[list[Example]]:
        """After each full batch, a batch of ``sizes[0]`` x answer drills and one of ``sizes[1]`` x query
        drills (2 and 4: each about as long to run as a full batch with the long system prompt)."""
        out: list[list[Example]] = []
        for batch in full:
            out.append(batch)
            for pool, n in ((self.answers, sizes[0] * batch_size), (self.queries, sizes[1] * batch_size)):
                if pool:
                    out.append(rng.sample(pool, min(n, len(pool))))
        return out

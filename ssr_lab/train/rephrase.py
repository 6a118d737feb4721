"""Rephrasing augmentation for SFT: a drawn question is sometimes asked in other words.

The benchmark keeps one phrasing of every question form for the test split (the last stem of each
attribute, "{Ref} was completed in which year?", and the picture reference "the {noun} in the image"),
so that test success measures whether a model follows the situation, not a template. Ours did not:
R4 answered 99 of 166 test questions asked in training phrasings (60%) and 20 of 74 in held-out ones
(27%); named questions 29/31 against 0/9, search 19/19 against 8/21, its first move going to general
knowledge or a text search when the picture was called "the ... in the image". A real Qwen3-VL brings
years of English from pretraining; our tiny model knows only the training stems.

This module writes other phrasings of a training question at each draw, from generic rules, never the
held-out forms (``tests/train/test_rephrase.py`` checks that no rephrasing matches a held-out stem or
picture reference): the picture reference in other words ("the pictured gate", "the gate in this photo"),
the question framed around its subject ("The Rossmir Bridge: where is it?"), a lead-in ("Tell me, ...")
or a closing request. The question's tokens are swapped in place in the compact ids (the project's
tokenizers keep words apart, as ``rename.py`` relies on too); everything else stays token for token.

The picture kinds (visual, detail; only when asked for: ``pictures=True``) get other stems, in frames the
big sign (answered from the picture) and the small plaque (zoomed first) share, so that the noun decides
the move, not the sentence's shape: R32 answered 78 of 119 held-out detail questions ("The small plaque
shows which character?") from the picture without zooming, after training on three frames only.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from ssr_lab.train.data import Example
from ssr_lab.world.attributes import PERSON_ATTRIBUTES
from ssr_lab.world.categories import CATEGORIES, PICTURE_REFS
from ssr_lab.world.records import Question
from ssr_lab.world.templates import DETAIL, VISUAL, capitalise, stem_fields, unfill, unfill_fields

# Other ways to point at the picture's subject; none is a form of PICTURE_REFS.
PICTURE_ALTERNATIVES = ("the pictured {noun}", "the {noun} in this photo", "the {noun} seen here",
                        "the {noun} in the photograph", "the {noun} you can see", "this very {noun}")
# More of them (``more_refs``): "the" as well as "this" before the picture's container word, and other such
# words. Without them R34 started 36 of 60 held-out search questions ("the lighthouse in the image") with a
# text search, and as many when "image" became "photo", but none with "photograph" or "this image": the
# frame "in the <word>" had been seen with one word only.
MORE_PICTURE_ALTERNATIVES = (*PICTURE_ALTERNATIVES, "the {noun} in the picture", "the {noun} in the photo",
                             "the {noun} in the shot", "the {noun} in this shot",
                             "the {noun} in the snapshot", "the {noun} in the frame")
LEAD_INS = ("Tell me, {q}", "Quick question: {q}", "I would like to know: {q}")
CLOSINGS = ("{Q} Please answer briefly.", "{Q} Thanks!")
TOPICAL = "{Ref}: {q}"  # the question framed around its subject, the subject then named by a pronoun
FACT_KINDS = ("search", "named", "knowledge")
PICTURE_KINDS = ("visual", "detail")
# Other stems of the picture kinds, by what they read (templates.VISUAL's aspects, "plaque" for detail);
# the fields are the world's (templates.py). None is a held-out stem (tests/train/test_rephrase.py).
PICTURE_STEMS: dict[str, tuple[str, ...]] = {
    "plaque": ("Which character does the small {pn} show?", "What character is on the tiny {pn}?",
               "Read the little {pn} for me: what character is on it?",
               "What is printed on the small {pn} by the {rn}?",
               "The tiny {pn} here: which character does it carry?",
               "Look at the small {pn}: what character is written there?"),
    "char": ("Which {kind} is on the sign {place}?", "Which {kind} does the large sign show?",
             "Read the big sign for me: what {kind} is on it?",
             "The big sign here: which {kind} does it carry?",
             "Look at the big sign: what {kind} is written there?"),
    "shape": ("Which shape is on the sign {place}?", "Which shape does the large sign show?",
              "The big sign here: which shape does it carry?",
              "Look at the big sign: what shape is drawn there?"),
    "colour": ("Tell me the colour of the {cn}.", "Look at the {cn}: which colour do you see?",
               "The {cn} here: which colour?", "Which colour can you see on the {cn}?"),
    "count": ("How many {cnt} are on the {rn}?", "The {rn} here: how many {cnt} does it have?",
              "Look at the {rn}: how many {cnt} can you count?", "Count the {cnt} on the {rn} for me."),
}
# Stems that open on a prepositional phrase (``openings``): every model before R50 took one of the blind
# check's such forms for another move - R49 searched by image on all 60 of "On the small badge, which
# character appears?", R47 on 27 of 60 of "On the big sign, which shape appears?" - as no training sentence
# began with its subject's place. The sign and the plaque share frames here too; none is a held-out stem or
# a blind-check form.
OPENING_STEMS: dict[str, tuple[str, ...]] = {
    "plaque": ("On the tiny {pn}, what character is printed?",
               "On the little {pn} by the {rn}, which character is written?",
               "Near the {rn}, on the small {pn}: what character?",
               "For the small {pn}, which character does it carry?"),
    "char": ("On the large sign, what {kind} is printed?", "On the sign {place}, which {kind} is written?",
             "For the big sign, which {kind} does it carry?"),
    "shape": ("On the large sign, what shape is drawn?", "On the sign {place}, which shape is painted?",
              "For the big sign, which shape does it carry?"),
    "colour": ("In this photo, what colour {be} the {cn}?", "In this shot, which colour {be} the {cn}?"),
    "count": ("On the {rn}, how many {cnt} are there?", "In this photo, how many {cnt} does the {rn} have?"),
}


def _with_fields(by_aspect: dict[str, tuple[str, ...]]) -> dict[str, tuple[tuple[str, frozenset[str]], ...]]:
    return {aspect: tuple((s, stem_fields(s)) for s in stems) for aspect, stems in by_aspect.items()}


_STEM_FIELDS, _OPENING_FIELDS = _with_fields(PICTURE_STEMS), _with_fields(OPENING_STEMS)


def _picture_noun(ref: str) -> str | None:
    """The noun of a picture reference made from one of PICTURE_REFS, else None."""
    for form in PICTURE_REFS:
        noun = unfill(form, "noun", ref)
        if noun is not None and " " not in noun:
            return noun
    return None


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


def _picture_rephrased(q: Question, rng: random.Random, openings: bool = False) -> str | None:
    parts = q.template.split("/")
    try:
        aspect, stem = (("plaque", DETAIL[int(parts[1])]) if q.kind == "detail"
                        else (parts[1], VISUAL[parts[1]][int(parts[2])]))
    except (IndexError, KeyError, ValueError):
        return None
    fields = unfill_fields(stem, q.question)
    if fields is None:
        return None
    stems = (*_STEM_FIELDS.get(aspect, ()), *(_OPENING_FIELDS.get(aspect, ()) if openings else ()))
    options = [s for s, needs in stems if needs <= fields.keys()]
    if not options:
        return None
    question = capitalise(rng.choice(options).format(**fields))
    frame = rng.randrange(3)
    if frame == 0 and question.endswith("?") and ":" not in question:
        return rng.choice(LEAD_INS).format(q=_lower_first(question))
    if frame == 1 and question.endswith("?"):
        return rng.choice(CLOSINGS).format(Q=question)
    return question


def rephrased(q: Question, rng: random.Random, refs: Sequence[str] = PICTURE_ALTERNATIVES,
              openings: bool = False) -> str | None:
    """Another phrasing of ``q`` (a training question), or None when ``q``'s template is not one we can
    take apart; a picture reference becomes one of ``refs``; with ``openings`` a picture question's stems
    include OPENING_STEMS."""
    if q.kind in PICTURE_KINDS:
        return _picture_rephrased(q, rng, openings)
    parts = q.template.split("/")
    if q.kind not in (*FACT_KINDS, "two_hop") or len(parts) != 4:
        return None
    if q.kind == "two_hop":
        stem, role = PERSON_ATTRIBUTES[parts[1]].questions[int(parts[2])], CATEGORIES[q.category].role
        pronoun = "this person"
    else:
        stem = CATEGORIES[q.category].attribute(parts[1]).questions[int(parts[2])]
        role, pronoun = "{ref}", "it"
    whole = unfill(stem, "ref", q.question)
    inner = unfill(role, "ref", whole) if whole is not None else None
    if whole is None or inner is None:
        return None
    noun = _picture_noun(inner)
    if noun is not None and rng.random() < 0.6:
        inner = rng.choice(refs).format(noun=noun)
    ref = role.format(ref=inner)
    frame = rng.randrange(4)
    if frame == 0 and not stem.startswith("{"):
        return TOPICAL.format(Ref=capitalise(ref), q=_lower_first(stem.format(ref=pronoun)))
    question = capitalise(stem.format(ref=ref))
    if frame == 1:
        return rng.choice(LEAD_INS).format(q=_lower_first(question))
    if frame == 2:
        return rng.choice(CLOSINGS).format(Q=question)
    return question


class Rephraser:
    """Rephrases each drawn example's question with probability ``share`` (deterministic for ``rng``);
    the fact and two-hop kinds, with ``pictures`` the visual and detail ones too, with ``more_refs`` the
    picture references drawn from MORE_PICTURE_ALTERNATIVES, with ``openings`` the picture questions' stems
    from OPENING_STEMS too."""

    def __init__(self, tok: Any, questions: Sequence[Question], share: float = 0.5,
                 pictures: bool = False, more_refs: bool = False, openings: bool = False) -> None:
        if not 0 <= share <= 1:
            raise ValueError("the rephrased share is a probability")
        self.tok, self.share, self.openings = tok, share, openings
        self.refs = MORE_PICTURE_ALTERNATIVES if more_refs else PICTURE_ALTERNATIVES
        kinds = (*FACT_KINDS, "two_hop", *(PICTURE_KINDS if pictures else ()))
        self.questions = {q.id: q for q in questions if q.kind in kinds}
        self._tokens: dict[str, tuple[int, ...]] = {}

    def _enc(self, text: str) -> tuple[int, ...]:
        return tuple(self.tok.encode(text, add_special_tokens=False))

    def example(self, ex: Example, rng: random.Random) -> Example:
        """``ex`` with its question rephrased (``ex`` itself when its question is not found once)."""
        q = self.questions.get(ex.key.split("/", 1)[0])
        if q is None:
            return ex
        if q.id not in self._tokens:  # each question encoded once, not at every draw
            self._tokens[q.id] = self._enc(q.question)
        old = self._tokens[q.id]
        at = [i for i in range(len(ex.ids) - len(old) + 1)
              if ex.ids[i] == old[0] and ex.ids[i : i + len(old)] == old]
        text = rephrased(q, rng, self.refs, self.openings)
        if len(at) != 1 or text is None or any(ex.mask[at[0] : at[0] + len(old)]):
            return ex
        new, i = self._enc(text), at[0]
        ids = ex.ids[:i] + new + ex.ids[i + len(old):]
        mask = ex.mask[:i] + (False,) * len(new) + ex.mask[i + len(old):]
        return Example(ex.key, ex.kind, ids, mask, ex.images)

    def __call__(self, examples: Sequence[Example], rng: random.Random) -> list[Example]:
        return [self.example(ex, rng) if rng.random() < self.share else ex for ex in examples]

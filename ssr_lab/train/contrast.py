"""Contrast drills: a two-hop question's second query drill, asked the other way too.

The shipped models made the four right moves on most failed two-hop questions and answered the wrong
fact: the second query ended in ``born`` for a town question or ``birthplace`` for a year question
(README, Training). ``born`` is in nearly every question of both kinds ("When was the architect of this
bridge born?" vs "Where was ...born?"), so copying from the question favours it, and which way a model
leant changed from run to run (R2 year 3/24, town 9/16; R3 11/24, 0/16). A contrast drill copies a
second-hop query drill, rewrites its question with a stem of the other attribute around the same
reference phrase, and the call's last word with the other attribute's keyword: the pair differs only
in the words that decide, so the loss falls only by reading them.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from ssr_lab.train.data import Example, occurrences
from ssr_lab.world.attributes import PERSON_ATTRIBUTES
from ssr_lab.world.records import Question
from ssr_lab.world.templates import fill, unfill

KEYS = ("born", "birthplace")  # the person attributes a two-hop question asks about


def _find_last(ids: Sequence[int], part: Sequence[int], start: int = 0) -> int:
    hits = occurrences(ids, part, start)
    return hits[-1] if hits else -1


def flipped_question(q: Question, rng: random.Random) -> str | None:
    """``q`` (a two-hop question) asked about the other attribute, with a stem the training split may
    use (never the held-out last one); None when ``q`` is not a two-hop question we can rewrite."""
    parts = q.template.split("/")
    if q.kind != "two_hop" or len(parts) != 4 or parts[1] not in KEYS:
        return None
    ref = unfill(PERSON_ATTRIBUTES[parts[1]].questions[int(parts[2])], "ref", q.question)
    if ref is None:
        return None
    other = PERSON_ATTRIBUTES[KEYS[1 - KEYS.index(parts[1])]].questions
    return fill(other[rng.randrange(len(other) - 1)], ref=ref)


def contrast_drill(drill: Example, q: Question, tok: Any, rng: random.Random) -> Example | None:
    """``drill`` (a query drill of ``q``) asked about the other attribute; None unless its question
    occurs once and its predicted call ends in the asked attribute's keyword."""
    key = q.template.split("/")[1] if q.kind == "two_hop" else ""
    if key not in KEYS:
        return None

    def enc(s: str) -> list[int]:
        return list(tok.encode(s, add_special_tokens=False))

    ids, mask = list(drill.ids), list(drill.mask)
    old_q, old_kw = enc(q.question), enc(" " + PERSON_ATTRIBUTES[key].keyword)
    at_q = _find_last(ids, old_q)
    first_loss = mask.index(True) if True in mask else len(ids)
    at_kw = _find_last(ids, old_kw, first_loss)
    if at_q < 0 or at_q + len(old_q) > first_loss or _find_last(ids[:at_q], old_q) >= 0 or at_kw < 0:
        return None
    text = flipped_question(q, rng)  # drawn only for a drill it rewrites: one draw per contrast drill
    if text is None:
        return None
    new_q, new_kw = enc(text), enc(" " + PERSON_ATTRIBUTES[KEYS[1 - KEYS.index(key)]].keyword)
    # the keyword first: it lies after the question, so the question's offsets still hold
    ids[at_kw : at_kw + len(old_kw)] = new_kw
    mask[at_kw : at_kw + len(old_kw)] = [True] * len(new_kw)
    ids[at_q : at_q + len(old_q)] = new_q
    mask[at_q : at_q + len(old_q)] = [False] * len(new_q)
    return Example(drill.key + "/contrast", drill.kind, tuple(ids), tuple(mask), ())


def contrast_drills(queries: Sequence[Example], questions: Sequence[Question], tok: Any,
                    rng: random.Random) -> list[Example]:
    """One contrast drill for each two-hop query drill of ``queries`` that asks for a person attribute."""
    by_id = {q.id: q for q in questions}
    out = []
    for drill in queries:
        q = by_id.get(drill.key.split("/", 1)[0])
        if q is not None and q.kind == "two_hop" and (d := contrast_drill(drill, q, tok, rng)) is not None:
            out.append(d)
    return out

"""``train sft --search-count``: count questions trained as search-by-image, then answer from the evidence.

The world's count questions ("How many columns does the gate in this picture have?") are answered from
the question image alone, and that is the gold a larger model meets. Our tiny towers cannot count: every
tower tried reads the count at chance (six values) from the picture and from a zoomed crop alike
(docs/training-log.md). The image search can: the world's index describes every pictured entity with the
count of its parts ("The Fruon Nocturne is a painting in a yellow frame showing 2 stars.", as
``entities.describe`` writes it), and the first hit of a test count question's picture is its own
entity. With this option the training split's count questions search by image and answer from that
evidence, two of the library's moves a search question already uses; the world is not changed (its
questions and gold moves stay as built), and a model so trained takes one more turn on those questions
(the evaluation scores the answer; its move accuracy counts the search as a wrong first move).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace

from ssr_server.world.records import FROM_EVIDENCE, FROM_IMAGE, IDENTIFY, MOVE_ACTIONS, Move, Question

SEARCHABLE = ("count", "colour")  # what the world's image search descriptions say about a look


def searched(q: Question) -> bool:
    """Whether a visual question's moves were rewritten by ``search_looks``."""
    return q.kind == "visual" and any(m.move == IDENTIFY for m in q.moves)


def search_looks(questions: Sequence[Question], attributes: Collection[str] = ("count",)) -> list[Question]:
    """``questions`` with every visual question about one of ``attributes`` answered as a search by image
    (the hits must hold its entity's title) and then from the evidence; the others as they are."""
    unknown = set(attributes) - set(SEARCHABLE)
    if unknown:
        raise ValueError(f"image search descriptions hold {' and '.join(SEARCHABLE)}, not {sorted(unknown)}")
    out: list[Question] = []
    for q in questions:
        if q.kind != "visual" or q.attribute not in attributes or [m.move for m in q.moves] != [FROM_IMAGE]:
            out.append(q)
            continue
        moves = [Move(IDENTIFY, MOVE_ACTIONS[IDENTIFY], expect_title=q.entity),
                 Move(FROM_EVIDENCE, MOVE_ACTIONS[FROM_EVIDENCE], answer=q.answer)]
        out.append(replace(q, moves=moves))
    return out

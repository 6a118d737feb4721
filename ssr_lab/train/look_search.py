"""``train sft``'s ``search_count``: count questions trained as a search, as a search question's are.

The world's count questions ("How many arms can you see on the cactus?") are answered from the question
image alone, and that is the gold a larger model meets. Our tiny towers cannot count: every tower tried
reads the count at chance (six values) from the picture and from a zoomed crop alike
(docs/lab/training-log.md). The world's text corpus can: each pictured entity has a description document
that says the count of its parts ("The Heisar cactus is a plant with 3 arms.", ``entities.describe``).
With this option the training split's count questions take a search question's three moves: a search by
image (the hits list the entity's title; the paper's format shows titles and URLs, not the index's
descriptions), a text search for the title and the counted parts' noun (the question's own word), whose
first hit is the description for 155 of the 158 test count questions and all 169 dev ones, and the
answer from that evidence. The world is not changed (its questions and gold moves stay as built); a model
so trained takes two more turns on those questions (the evaluation scores the answer; its move accuracy
counts the search as a wrong first move).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ssr_lab.world.categories import MOTIFS
from ssr_lab.world.entities import Entity
from ssr_lab.world.records import (
    FROM_EVIDENCE,
    FROM_IMAGE,
    IDENTIFY,
    LOOKUP,
    MOVE_ACTIONS,
    Move,
    Question,
    WorldError,
)


def searched(q: Question) -> bool:
    """Whether a visual question's moves were rewritten by ``search_counts``."""
    return q.kind == "visual" and any(m.move == IDENTIFY for m in q.moves)


def count_query(e: Entity) -> str:
    """The text search that finds ``e``'s description: its title and the counted parts' noun."""
    return f"{e.title} {MOTIFS[e.look.motif].count_noun}"


def search_counts(questions: Sequence[Question], entities: Sequence[Entity]) -> list[Question]:
    """``questions`` with every count question answered as a search: by image (the hits must list its
    entity's title), then by text for its description, then from that evidence; the others as they are."""
    by_id = {e.id: e for e in entities}
    out: list[Question] = []
    for q in questions:
        if q.kind != "visual" or q.attribute != "count" or [m.move for m in q.moves] != [FROM_IMAGE]:
            out.append(q)
            continue
        e = by_id.get(q.entity_id)
        if e is None:
            raise WorldError(f"question {q.id} is about {q.entity_id}, which the entities do not hold")
        moves = [Move(IDENTIFY, MOVE_ACTIONS[IDENTIFY], expect_title=e.title),
                 Move(LOOKUP, MOVE_ACTIONS[LOOKUP], query=count_query(e), expect_url=e.url,
                      expect_text=e.description),
                 Move(FROM_EVIDENCE, MOVE_ACTIONS[FROM_EVIDENCE], answer=q.answer)]
        out.append(replace(q, moves=moves))
    return out

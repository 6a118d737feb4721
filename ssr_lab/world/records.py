"""Question records as written to ``questions.jsonl``, and their validation.

Each record carries everything an oracle needs to replay it through the real tools: the image, the
gold move ids of the default library, and per move its gold argument (the text-search query, the zoom
box and label, the answer) plus what the move is expected to turn up (the entity title an image search
must list, the URL of the document a text search must return).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ssr_server.core.errors import SSRError

IDENTIFY, LOOKUP, ZOOM = "r_IDENTIFY_BY_IMAGE", "r_LOOKUP_FACT", "r_ZOOM_DETAIL"
FROM_EVIDENCE, FROM_IMAGE, FROM_KNOWLEDGE = "r_ANSWER_FROM_EVIDENCE", "r_ANSWER_FROM_IMAGE", "r_GENERAL_KNOW"
MOVE_ACTIONS: dict[str, str] = {IDENTIFY: "image_search", LOOKUP: "text_search", ZOOM: "zoom",
                                FROM_EVIDENCE: "answer", FROM_IMAGE: "answer", FROM_KNOWLEDGE: "answer"}
KIND_MOVES: dict[str, tuple[str, ...]] = {
    "search": (IDENTIFY, LOOKUP, FROM_EVIDENCE),
    "named": (LOOKUP, FROM_EVIDENCE),
    "visual": (FROM_IMAGE,),
    "detail": (ZOOM, FROM_IMAGE),
    "knowledge": (FROM_KNOWLEDGE,),
    "two_hop": (IDENTIFY, LOOKUP, LOOKUP, FROM_EVIDENCE),
}
KINDS: tuple[str, ...] = tuple(KIND_MOVES)
SPLITS: tuple[str, ...] = ("train", "dev", "test")
_ACTION_FIELDS: dict[str, tuple[str, ...]] = {  # the fields a move of each action type carries
    "image_search": ("expect_title",),
    "text_search": ("query", "expect_url", "expect_text"),
    "zoom": ("box", "label", "image_index"),
    "answer": ("answer",),
}


class WorldError(SSRError):
    """A world could not be built or a world file is malformed."""

    code = "world_error"


@dataclass
class Move:
    """One gold move: the candidate id and its argument (only the fields its action uses are set)."""

    move: str
    action: str
    query: str = ""  # text_search
    box: list[int] = field(default_factory=list)  # zoom: [x1, y1, x2, y2] in 0-1000 of the image
    label: str = ""  # zoom: what is inside the box
    image_index: int = 0  # zoom: which image of the run (0: the question image)
    answer: str = ""  # answer moves
    expect_title: str = ""  # image_search: the title that must be among the hits
    expect_url: str = ""  # text_search: the document that must be among the hits
    expect_text: str = ""  # text_search: that document's text

    def to_json(self) -> dict[str, Any]:
        return {"move": self.move, "action": self.action,
                **{k: getattr(self, k) for k in _ACTION_FIELDS[self.action]}}


@dataclass
class Question:
    id: str
    split: str
    kind: str
    question: str
    image: str  # path relative to the world folder
    entity_id: str
    entity: str  # the entity's title
    category: str
    attribute: str  # fact key, "colour" | "count" | "shape" | "char" (visual), "plaque", or "a>b" (two-hop)
    answer: str
    aliases: list[str]
    answer_set: str  # closed set of pixel answers ("colours", "shapes", "counts", "chars"), else ""
    template: str
    heldout_template: bool
    moves: list[Move]

    def to_json(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}  # not asdict: no deep copies
        d["moves"] = [m.to_json() for m in self.moves]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Question:
        try:
            moves = [Move(**m) for m in d["moves"]]
            return cls(**{**d, "moves": moves})
        except (KeyError, TypeError) as e:
            raise WorldError(f"malformed question record {d.get('id', '?')!r}: {e}") from None


def validate(q: Question) -> None:
    """Raise WorldError unless the record is well-formed (moves, arguments, split, kind)."""

    def bad(why: str) -> WorldError:
        return WorldError(f"question {q.id}: {why}")

    if q.kind not in KIND_MOVES or q.split not in SPLITS:
        raise bad(f"unknown kind {q.kind!r} or split {q.split!r}")
    if tuple(m.move for m in q.moves) != KIND_MOVES[q.kind]:
        raise bad(f"moves {[m.move for m in q.moves]} do not fit kind {q.kind!r}")
    if not (q.question.strip() and q.answer.strip() and q.image):
        raise bad("empty question, answer or image")
    for m in q.moves:
        if m.action != MOVE_ACTIONS[m.move]:
            raise bad(f"move {m.move} has action {m.action!r}")
        if m.action == "text_search" and not (m.query.strip() and m.expect_url):
            raise bad("a text search needs a query and an expected document")
        if m.action == "image_search" and not m.expect_title:
            raise bad("an image search needs an expected title")
        if m.action == "zoom":
            if len(m.box) != 4 or not all(isinstance(v, int) and 0 <= v <= 1000 for v in m.box):
                raise bad(f"zoom box {m.box} is not four integers in 0-1000")
            if not (m.box[0] < m.box[2] and m.box[1] < m.box[3]) or not m.label:
                raise bad(f"zoom box {m.box} needs x1 < x2, y1 < y2 and a label")
        if m.action == "answer" and m.answer != q.answer:
            raise bad("the answer move must carry the gold answer")


def load_questions(path: str | os.PathLike[str]) -> list[Question]:
    """Read and validate ``questions.jsonl``."""
    out = []
    with Path(path).open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
            except ValueError as e:
                raise WorldError(f"{path}:{lineno}: not valid JSON ({e})") from None
            q = Question.from_json(raw)
            validate(q)
            out.append(q)
    return out

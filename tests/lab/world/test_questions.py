"""Every question is well-formed: gold moves of the six library ids, valid arguments, closed sets."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from ssr_lab.world import KIND_MOVES, KINDS, Question, WorldError, load_questions
from ssr_lab.world.closed_sets import CHARS, COLOURS, SHAPES
from ssr_lab.world.knowledge import knowledge_entities
from ssr_lab.world.picture import PICTURE_SIZE
from ssr_lab.world.records import validate

LIBRARY_IDS = {"r_IDENTIFY_BY_IMAGE", "r_LOOKUP_FACT", "r_ZOOM_DETAIL", "r_ANSWER_FROM_EVIDENCE",
               "r_ANSWER_FROM_IMAGE", "r_GENERAL_KNOW"}
CLOSED = {"colours": set(COLOURS), "shapes": set(SHAPES), "counts": {"1", "2", "3", "4", "5", "6"},
          "chars": set(CHARS)}


def test_every_kind_is_present_with_its_moves(questions: list[Question]) -> None:
    kinds = Counter(q.kind for q in questions)
    assert set(kinds) == set(KINDS)
    assert kinds["two_hop"] < kinds["search"] and kinds["knowledge"] < kinds["search"]
    for q in questions:
        assert [m.move for m in q.moves] == list(KIND_MOVES[q.kind])
        assert {m.move for m in q.moves} <= LIBRARY_IDS
        assert q.moves[-1].answer == q.answer
    assert {m for moves in KIND_MOVES.values() for m in moves} == LIBRARY_IDS


def test_arguments_are_present_and_valid(questions: list[Question]) -> None:
    for q in questions:
        for m in q.moves:
            if m.action == "text_search":
                assert m.query.strip() and m.expect_url.startswith("https://") and m.expect_text
            elif m.action == "zoom":
                x1, y1, x2, y2 = m.box
                assert all(isinstance(v, int) for v in m.box)
                assert 0 <= x1 < x2 <= 1000 and 0 <= y1 < y2 <= 1000, m.box
                assert x2 - x1 >= 20 and y2 - y1 >= 20 and m.label  # the zoom tool refuses slivers
                assert m.image_index == 0
            elif m.action == "image_search":
                assert m.expect_title == q.entity


def test_pixel_answers_come_from_the_closed_sets(questions: list[Question]) -> None:
    seen: Counter[str] = Counter()
    for q in questions:
        if q.kind in ("visual", "detail"):
            assert q.answer in CLOSED[q.answer_set], (q.id, q.answer, q.answer_set)
            seen[q.attribute] += 1
        else:
            assert q.answer_set == ""
    assert set(seen) == {"colour", "count", "shape", "char", "plaque"}


def test_facts_come_from_the_documents_the_moves_expect(questions: list[Question]) -> None:
    for q in questions:
        lookups = [m for m in q.moves if m.action == "text_search"]
        if q.kind in ("search", "named"):
            assert q.answer in lookups[0].expect_text
            assert lookups[0].query.startswith(q.entity)
        if q.kind == "two_hop":
            person = lookups[1].query.rsplit(" ", 1)[0]
            assert person in lookups[0].expect_text  # the first look-up names the second hop
            assert q.answer in lookups[1].expect_text
        if q.kind in ("search", "two_hop", "visual", "detail"):
            assert q.entity not in q.question  # the picture, not the question, says what it is
        if q.kind == "named":
            assert q.entity in q.question


def test_knowledge_answers_are_the_fixed_facts(questions: list[Question]) -> None:
    facts = {(k.id, f.key): f.value.text for k in knowledge_entities() for f in k.facts}
    for q in questions:
        if q.kind == "knowledge":
            assert facts[q.entity_id, q.attribute] == q.answer


def test_images_exist_and_are_views(world_root: Path, questions: list[Question]) -> None:
    for image in {q.image for q in questions}:
        with Image.open(world_root / image) as img:
            assert img.format == "JPEG" and img.size == PICTURE_SIZE
    assert all(q.question.endswith("?") for q in questions)


def test_malformed_records_are_rejected(questions: list[Question], tmp_path: Path) -> None:
    q = questions[0]
    raw = q.to_json()
    bad_box = {**raw, "kind": "detail", "moves": [
        {"move": "r_ZOOM_DETAIL", "action": "zoom", "box": [500, 10, 400, 90], "label": "x"},
        {"move": "r_ANSWER_FROM_IMAGE", "action": "answer", "answer": q.answer}]}
    wrong_moves = {**raw, "moves": raw["moves"][1:]}
    for record in (bad_box, wrong_moves):
        with pytest.raises(WorldError):
            validate(Question.from_json(record))
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps(raw) + "\n{not json\n")
    with pytest.raises(WorldError, match="not valid JSON"):
        load_questions(path)

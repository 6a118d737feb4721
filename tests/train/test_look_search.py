"""``train sft --search-count``: count questions search by image and answer from the first hit."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from ssr_server.train.look_search import search_looks, searched
from ssr_server.world import load_questions
from ssr_server.world.records import FROM_EVIDENCE, FROM_IMAGE, IDENTIFY


@pytest.fixture(scope="module")
def counts(world_dir: Path) -> tuple[list[Any], list[Any]]:
    questions = load_questions(world_dir / "questions.jsonl")
    return questions, search_looks(questions)


def is_count(q: Any) -> bool:
    return bool(q.kind == "visual" and q.attribute == "count")


def test_count_questions_search_then_answer_and_nothing_else_changes(counts: Any) -> None:
    questions, rewritten = counts
    assert [q.id for q in rewritten] == [q.id for q in questions]
    asked = [(q, r) for q, r in zip(questions, rewritten, strict=True) if is_count(q)]
    assert len(asked) >= 3 and all([m.move for m in q.moves] == [FROM_IMAGE] for q, _ in asked)
    for q, r in zip(questions, rewritten, strict=True):
        if not is_count(q):
            assert r == q and not searched(r)
            continue
        assert searched(r) and (r.question, r.answer, r.image, r.aliases) == (q.question, q.answer, q.image,
                                                                               q.aliases)
        want = [(IDENTIFY, "image_search"), (FROM_EVIDENCE, "answer")]
        assert [(m.move, m.action) for m in r.moves] == want
        assert r.moves[0].expect_title == q.entity and r.moves[1].answer == q.answer
    assert search_looks(rewritten) == rewritten  # once rewritten, left as it is
    colours = search_looks(questions, ("colour",))
    assert {q.id for q, r in zip(questions, colours, strict=True) if r != q} == {
        q.id for q in questions if q.kind == "visual" and q.attribute == "colour"}
    with pytest.raises(ValueError, match="not \\['shape'\\]"):
        search_looks(questions, ("count", "shape"))


def test_the_first_hit_of_a_count_picture_is_its_entity_and_its_description_holds_the_count(
        world_dir: Path, counts: Any) -> None:
    # What the route rests on, for every count question of the world (all splits).
    from ssr_server.tools.image_search import LocalImageIndex

    index = LocalImageIndex(world_dir / "images")
    asked = [q for q in counts[0] if is_count(q)]
    for q in asked:
        with Image.open(world_dir / q.image) as img:
            distance, hit = index.distances(img.convert("RGB"))[0]
        assert hit.title == q.entity and distance <= index.max_distance
        words = re.findall(r"(?:with|showing) (\d) ", hit.description)
        assert words == [q.answer], hit.description


def test_searched_trajectories_replay_end_in_the_count_and_draw_no_picture_drill(world_dir: Path,
                                                                                  counts: Any) -> None:
    from ssr_server.formats.format import get_format
    from ssr_server.library import LibraryRegistry
    from ssr_server.train.data import Example
    from ssr_server.train.picture_drills import PictureDrills
    from ssr_server.train.setup import _cache_path, new_model, oracle_examples
    from ssr_server.world.build import world_entities

    questions, rewritten = counts
    fmt, library = get_format(), LibraryRegistry().get("default")
    picked = [q for q in rewritten if q.split == "train" and is_count(q)][:4]
    plain = [q for q in questions if q.split == "train" and is_count(q)][:4]
    assert len(picked) >= 2
    _, tok = new_model("64x1", world_dir, picked, fmt, library, 0)
    examples, dropped = asyncio.run(oracle_examples(world_dir, picked, tok, fmt, library, "ssr",
                                                    progress=False))
    assert dropped == 0 and len(examples) == len(picked)
    for ex, q in zip(examples, picked, strict=True):
        text = tok.decode(list(ex.ids))
        assert "image_search" in text and q.entity in text  # the hit's title and description are shown
        said = tok.decode([t for t, m in zip(ex.ids, ex.mask, strict=True) if m])
        assert said.count("<answer>") == 1
        assert said.rstrip().endswith(f"<answer>{q.answer}</answer><|im_end|>")
        assert "image_search" in said  # the model calls the search itself
    entities = world_entities(world_dir)
    assert PictureDrills.of(examples, picked, entities, tok, fmt).sources == []
    bare = [Example(ex.key, ex.kind, ex.ids, ex.mask, ex.images[:1]) for ex in examples]  # no thumbnails
    assert PictureDrills.of(bare, picked, entities, tok, fmt).sources == []
    replayed, _ = asyncio.run(oracle_examples(world_dir, plain, tok, fmt, library, "ssr", progress=False))
    assert len(PictureDrills.of(replayed, plain, entities, tok, fmt).sources) == len(plain)  # the control
    keys = {_cache_path(world_dir, x, tok, fmt, library, "ssr", (0,), False) for x in (picked, plain)}
    assert len(keys) == 2  # a searching run never reads the plain run's trajectories

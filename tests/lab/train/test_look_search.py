"""``train sft --search-count``: count questions search by image, then by text, and answer the count."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from ssr_lab.train.look_search import count_query, search_counts, searched
from ssr_lab.world import load_questions
from ssr_lab.world.records import FROM_EVIDENCE, FROM_IMAGE, IDENTIFY, LOOKUP, WorldError


@pytest.fixture(scope="module")
def counts(world_dir: Path) -> tuple[list[Any], list[Any], list[Any]]:
    from ssr_lab.world.build import world_entities

    questions = load_questions(world_dir / "questions.jsonl")
    entities = world_entities(world_dir)
    return questions, search_counts(questions, entities), entities


def is_count(q: Any) -> bool:
    return bool(q.kind == "visual" and q.attribute == "count")


def test_count_questions_take_a_search_questions_moves_and_nothing_else_changes(counts: Any) -> None:
    questions, rewritten, entities = counts
    by_id = {e.id: e for e in entities}
    assert [q.id for q in rewritten] == [q.id for q in questions]
    asked = [(q, r) for q, r in zip(questions, rewritten, strict=True) if is_count(q)]
    assert len(asked) >= 3 and all([m.move for m in q.moves] == [FROM_IMAGE] for q, _ in asked)
    for q, r in zip(questions, rewritten, strict=True):
        if not is_count(q):
            assert r == q and not searched(r)
            continue
        e = by_id[q.entity_id]
        assert searched(r) and (r.question, r.answer, r.image, r.aliases) == (q.question, q.answer, q.image,
                                                                               q.aliases)
        want = [(IDENTIFY, "image_search"), (LOOKUP, "text_search"), (FROM_EVIDENCE, "answer")]
        assert [(m.move, m.action) for m in r.moves] == want
        found = (r.moves[0].expect_title, r.moves[1].expect_url, r.moves[2].answer)
        assert found == (e.title, e.url, q.answer)
        noun = r.moves[1].query.removeprefix(e.title + " ")
        assert noun and noun in q.question  # the counted parts' noun, as the question says it
        assert re.findall(r"(?:with|showing) (\d) ", r.moves[1].expect_text) == [q.answer]
    assert search_counts(rewritten, entities) == rewritten  # once rewritten, left as it is
    with pytest.raises(WorldError, match="entities do not hold"):
        search_counts(questions, [e for e in entities if e.id != asked[0][0].entity_id])


def test_the_text_search_finds_the_description_that_holds_the_count(world_dir: Path, counts: Any) -> None:
    # What the route rests on, for every count question of the world (all splits): the first hit of the
    # query the model is taught to write is the entity's description, which says the count.
    from ssr_server.tools.text_search import LocalBM25

    questions, _, entities = counts
    by_id = {e.id: e for e in entities}
    bm25 = LocalBM25.from_jsonl(world_dir / "corpus.jsonl")
    asked = [q for q in questions if is_count(q)]
    for q in asked:
        e = by_id[q.entity_id]
        hits = asyncio.run(bm25.search(count_query(e), 5))
        assert (hits[0].url, hits[0].text) == (e.url, e.description)
        assert re.findall(r"(?:with|showing) (\d) ", hits[0].text) == [q.answer]


def test_searched_trajectories_replay_show_the_count_and_draw_no_picture_drill(world_dir: Path,
                                                                                counts: Any) -> None:
    from ssr_lab.train.data import Example
    from ssr_lab.train.picture_drills import PictureDrills
    from ssr_lab.train.setup import _cache_path, new_model, oracle_examples
    from ssr_server.core.formats.format import get_format
    from ssr_server.core.library import LibraryRegistry

    questions, rewritten, entities = counts
    fmt, library = get_format(), LibraryRegistry().get("default")
    picked = [q for q in rewritten if q.split == "train" and is_count(q)][:4]
    plain = [q for q in questions if q.split == "train" and is_count(q)][:4]
    assert len(picked) >= 2
    _, tok = new_model("64x1", world_dir, picked, fmt, library, 0)
    examples, dropped = asyncio.run(oracle_examples(world_dir, picked, tok, fmt, library, "ssr",
                                                    progress=False))
    assert dropped == 0 and len(examples) == len(picked)
    for ex, q in zip(examples, picked, strict=True):
        said = tok.decode([t for t, m in zip(ex.ids, ex.mask, strict=True) if m])
        heard = tok.decode([t for t, m in zip(ex.ids, ex.mask, strict=True) if not m])
        assert "image_search" in said and q.moves[1].query in said  # the model writes both calls
        assert said.count("<answer>") == 1
        assert said.rstrip().endswith(f"<answer>{q.answer}</answer><|im_end|>")
        assert q.moves[1].expect_text in heard  # the count is in the context before the answer
    assert PictureDrills.of(examples, picked, entities, tok, fmt).sources == []
    bare = [Example(ex.key, ex.kind, ex.ids, ex.mask, ex.images[:1]) for ex in examples]  # no thumbnails
    assert PictureDrills.of(bare, picked, entities, tok, fmt).sources == []
    replayed, _ = asyncio.run(oracle_examples(world_dir, plain, tok, fmt, library, "ssr", progress=False))
    assert len(PictureDrills.of(replayed, plain, entities, tok, fmt).sources) == len(plain)  # the control
    other = [q if i else replace_query(q) for i, q in enumerate(picked)]
    keys = {_cache_path(world_dir, x, tok, fmt, library, "ssr", (0,), False) for x in (picked, plain, other)}
    assert len(keys) == 3  # a searching run never reads another route's trajectories


def replace_query(q: Any) -> Any:
    from dataclasses import replace

    return replace(q, moves=[q.moves[0], replace(q.moves[1], query=q.moves[1].query + " x"), q.moves[2]])

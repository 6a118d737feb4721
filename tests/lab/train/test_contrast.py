"""Contrast drills: a two-hop second query drill asked about the other person attribute."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ssr_lab.train.contrast import contrast_drill, contrast_drills, flipped_question
from ssr_lab.train.data import Example
from ssr_lab.train.drills import DrillTokens, query_drills
from ssr_lab.world.attributes import PERSON_ATTRIBUTES
from ssr_lab.world.templates import fill, unfill


def _said(tok: Any, ex: Example) -> str:
    return str(tok.decode([i for i, m in zip(ex.ids, ex.mask, strict=True) if m]))


@pytest.fixture(scope="module")
def two_hop(world_dir: Path) -> tuple[Any, Any, list[Any]]:
    """Two replayed two-hop trajectories, one per attribute when the world has both."""
    from ssr_lab.train.setup import new_model, oracle_examples
    from ssr_lab.world import load_questions
    from ssr_server.core.formats.format import get_format
    from ssr_server.core.library import LibraryRegistry

    fmt, library = get_format(), LibraryRegistry().get("default")
    train = [q for q in load_questions(world_dir / "questions.jsonl") if q.split == "train"]
    _, tok = new_model("64x1", world_dir, train, fmt, library, 0)
    hops = [q for q in train if q.kind == "two_hop"]
    picked = [next(q for q in hops if q.template.split("/")[1] == key) for key in ("born", "birthplace")
              if any(q.template.split("/")[1] == key for q in hops)]
    examples, dropped = asyncio.run(oracle_examples(world_dir, picked, tok, fmt, library, "ssr",
                                                    progress=False))
    assert dropped == 0 and picked
    return tok, fmt, list(zip(picked, examples, strict=True))


def test_a_flipped_question_asks_the_other_attribute_with_a_training_stem(two_hop: Any) -> None:
    _, _, pairs = two_hop
    for q, _ in pairs:
        key = q.template.split("/")[1]
        other = "birthplace" if key == "born" else "born"
        stems = PERSON_ATTRIBUTES[other].questions
        seen = {flipped_question(q, random.Random(seed)) for seed in range(40)}
        ref = unfill(PERSON_ATTRIBUTES[key].questions[int(q.template.split("/")[2])], "ref", q.question)
        assert ref is not None and ref in q.question
        # every stem but the held-out last one, never the question itself
        assert seen == {fill(s, ref=ref) for s in stems[:-1]} and q.question not in seen
    visual = replace(pairs[0][0], kind="visual", template="visual/colour/0")
    assert flipped_question(visual, random.Random(0)) is None


def test_a_contrast_drill_differs_only_in_the_question_and_the_last_word(two_hop: Any) -> None:
    tok, fmt, pairs = two_hop
    t = DrillTokens.of(tok, fmt)
    for q, ex in pairs:
        first, second = query_drills(ex, t)
        flip = contrast_drill(second, q, tok, random.Random(1))
        assert flip is not None and flip.key == second.key + "/contrast" and flip.images == ()
        key = q.template.split("/")[1]
        new_kw = "birthplace" if key == "born" else "born"
        text, said, old_said = tok.decode(list(flip.ids)), _said(tok, flip), _said(tok, second)
        assert q.question not in text and flipped_question(q, random.Random(1)) in text
        assert said == old_said.replace(f" {PERSON_ATTRIBUTES[key].keyword}\"", f" {new_kw}\"")
        assert said != old_said and said.count("<|im_end|>") == 1
        # the first hop's query names no person attribute: nothing to flip
        assert contrast_drill(first, q, tok, random.Random(1)) is None
        assert contrast_drills([first, second], [q], tok, random.Random(1)) == [flip]

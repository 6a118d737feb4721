"""A fresh model's tokenizer: the system prompt's lines are single tokens, the text is unchanged."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from ssr_lab.train.setup import (
    PHRASE_MIN_CHARS,
    load_model,
    new_model,
    param_groups,
    prompt_phrases,
    trainable,
)
from ssr_lab.world import load_questions
from ssr_lab.world.views import styled_box
from ssr_server.agent.escape import Escaper
from ssr_server.core.formats.format import get_format
from ssr_server.core.library import LibraryRegistry


@pytest.fixture(scope="module")
def tokenizers(world_dir: Path) -> tuple[Any, Any]:
    fmt, library = get_format(), LibraryRegistry().get("default")
    qs = [q for q in load_questions(world_dir / "questions.jsonl") if q.split == "train"]
    _, with_phrases = new_model("64x2", world_dir, qs, fmt, library, seed=0)
    _, without = new_model("64x2", world_dir, qs, fmt, library, seed=0, phrases=False)
    return with_phrases, without


def test_every_library_prompt_is_a_few_tokens_and_decodes_to_its_text(tokenizers: tuple[Any, Any]) -> None:
    tok, plain = tokenizers
    fmt, registry = get_format(), LibraryRegistry()
    for name in registry.names():
        text = fmt.system_prompt(registry.get(name))
        ids = tok.encode(text, add_special_tokens=False)
        long_ids = plain.encode(text, add_special_tokens=False)
        assert len(ids) < 120 < 1000 < len(long_ids), (name, len(ids), len(long_ids))
        assert tok.decode(ids, skip_special_tokens=True) == text  # added, not special: decoded back


def test_phrases_are_the_long_lines_and_leave_other_text_alone(tokenizers: tuple[Any, Any]) -> None:
    tok, plain = tokenizers
    fmt, registry = get_format(), LibraryRegistry()
    phrases = prompt_phrases(fmt, [registry.get(n) for n in registry.names()])
    assert phrases and all(len(p) >= PHRASE_MIN_CHARS and "\n" not in p for p in phrases)
    assert len(phrases) == len(set(phrases))
    one = tok.encode(phrases[0], add_special_tokens=False)
    assert len(one) == 1
    question = 'Where does the Zemclinard soup come from? {"query": "x"}'
    assert tok.encode(question, add_special_tokens=False) == plain.encode(question, add_special_tokens=False)


def test_a_phrase_in_external_text_is_neutralised(tokenizers: tuple[Any, Any]) -> None:
    tok, _ = tokenizers
    phrase = prompt_phrases(get_format(), [LibraryRegistry().get("default")])[0]
    escaped = Escaper.for_tokenizer(tok, {})(f"a web page quoting: {phrase}")
    assert phrase not in escaped
    assert len(tok.encode(escaped, add_special_tokens=False)) > 3


def test_zoom_styled_rewrites_only_zoom_boxes_and_keys_the_example_cache(world_dir: Path) -> None:
    from ssr_lab.train.setup import _cache_path, zoom_styled

    qs = [q for q in load_questions(world_dir / "questions.jsonl") if q.split == "train"][:60]
    before = copy.deepcopy(qs)
    strip = zoom_styled(qs, "strip")
    assert qs == before  # the world's gold boxes are not touched
    assert zoom_styled(qs, "tight") == qs
    for before, after in zip(qs, strip, strict=True):
        for m0, m1 in zip(before.moves, after.moves, strict=True):
            expected = [0, m0.box[1], 1000, m0.box[3]] if m0.action == "zoom" else m0.box
            assert m1.box == expected and (m1.move, m1.action, m1.label) == (m0.move, m0.action, m0.label)
    assert any(m.action == "zoom" for q in qs for m in q.moves)
    with pytest.raises(ValueError, match="zoom style"):
        zoom_styled(qs, "huge")
    fmt, library = get_format(), LibraryRegistry().get("default")
    _, tok = new_model("64x1", world_dir, qs, fmt, library, seed=0)
    coarse = zoom_styled(qs, "coarse")
    for before, after in zip(qs, coarse, strict=True):  # each zoom: the strip, then into the strip's crop
        expected = [m for m0 in before.moves for m in (
            [(m0.action, [0, m0.box[1], 1000, m0.box[3]], 0),
             (m0.action, [styled_box(m0.box, "wide")[0], 0, styled_box(m0.box, "wide")[2], 1000], 1)]
            if m0.action == "zoom" else [(m0.action, m0.box, m0.image_index)])]
        assert [(m.action, m.box, m.image_index) for m in after.moves] == expected
    paths = {_cache_path(world_dir, x, tok, fmt, library, "ssr", (0,), False) for x in (qs, strip, coarse)}
    assert len(paths) == 3  # a strip run never reads the tight run's trajectories


def test_trainable_leaves_out_exactly_the_frozen_tower(tiny_model_dir: Path) -> None:
    model, _ = load_model(tiny_model_dir)
    tower = {id(p) for p in model.model.visual.parameters()}
    assert set(map(id, trainable(model, False))) == {id(p) for p in model.parameters()}
    frozen = {id(p) for p in trainable(model, True)}
    assert tower and not frozen & tower and frozen == {id(p) for p in model.parameters()} - tower


def test_param_groups_give_the_tower_its_share_of_the_rate_and_adamw_moves_it_that_much(
        tiny_model_dir: Path) -> None:
    model, _ = load_model(tiny_model_dir)
    tower = {id(p) for p in model.model.visual.parameters()}
    trained = trainable(model, False)
    assert [(len(g["params"]), g["scale"]) for g in param_groups(model, trained)] == [(len(trained), 1.0)]
    groups = param_groups(model, trained, 0.25)
    assert [g["scale"] for g in groups] == [1.0, 0.25]
    assert {id(p) for p in groups[1]["params"]} == tower
    assert {id(p) for p in groups[0]["params"]} == {id(p) for p in trained} - tower
    assert [g["scale"] for g in param_groups(model, trainable(model, True), 0.25)] == [1.0]

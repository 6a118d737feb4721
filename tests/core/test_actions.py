"""The action table: argument schemas, the grammar built from them, and the checks beyond them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch
import xgrammar as xgr

from ssr_server.core.actions import ACTIONS, ALL_ACTIONS, TOOL_ACTIONS, allowed_actions, possible_actions
from ssr_server.core.errors import ActionParseError
from ssr_server.core.limits import MAX_LABEL_CHARS, MAX_QUERY_CHARS


def test_allowed_actions() -> None:
    assert allowed_actions("zoom") == ("zoom",)
    assert allowed_actions("tool") == TOOL_ACTIONS
    assert allowed_actions("any") == ALL_ACTIONS
    with pytest.raises(ValueError):
        allowed_actions("dance")


def test_without_an_image_only_the_moves_that_can_run_are_possible() -> None:
    assert possible_actions("any", 0) == ("text_search", "answer")
    assert possible_actions("tool", 0) == ("text_search",)
    assert possible_actions("zoom", 0) == possible_actions("image_search", 0) == ()
    for action in ("any", "tool", "zoom", "image_search", "text_search", "answer"):
        assert possible_actions(action, 1) == allowed_actions(action)


@pytest.mark.parametrize("action", ["zoom", "image_search"])
def test_an_image_move_has_no_grammar_and_no_call_without_an_image(action: str) -> None:
    with pytest.raises(ValueError, match="needs an image"):
        ACTIONS[action].arguments_schema(0)
    args = {"bbox_2d": [0, 0, 10, 10], "label": "a", "img_idx": 0} if action == "zoom" else {}
    with pytest.raises(ActionParseError, match="needs an image and there is none"):
        ACTIONS[action].to_call(args, 0)


@pytest.mark.parametrize(("n_images", "told"), [(1, "image 0 is the only one"),
                                                 (3, "images 0 to 2 are available")])
def test_a_missing_image_index_is_told_plainly(n_images: int, told: str) -> None:
    with pytest.raises(ActionParseError, match=told):
        ACTIONS["zoom"].to_call({"bbox_2d": [0, 0, 10, 10], "label": "a", "img_idx": 5}, n_images)


@pytest.mark.parametrize(("action", "args", "n_images"), [
    ("image_search", {}, 1),
    ("text_search", {"query": "Tresslin Bridge height"}, 0),
    ("zoom", {"bbox_2d": [0, 0, 1000, 1000], "label": "sign", "img_idx": 2}, 3),
])
def test_valid_arguments_validate_and_become_calls(action: str, args: dict[str, Any], n_images: int) -> None:
    spec = ACTIONS[action]
    jsonschema.validate(args, spec.arguments_schema(n_images))
    call = spec.to_call(args, n_images)
    assert call.tool == action


@pytest.mark.parametrize(("action", "args"), [
    ("image_search", {"image": 1}),
    ("text_search", {}),
    ("text_search", {"query": ""}),
    ("text_search", {"query": " leading space"}),
    ("text_search", {"query": "a <tag>"}),
    ("text_search", {"query": 'a "quote"'}),
    ("text_search", {"query": "x" * (MAX_QUERY_CHARS + 1)}),
    ("text_search", {"query": "ok", "extra": 1}),
    ("zoom", {"bbox_2d": [0, 0, 1001, 10], "label": "a", "img_idx": 0}),
    ("zoom", {"bbox_2d": [0, 0, 10], "label": "a", "img_idx": 0}),
    ("zoom", {"bbox_2d": [0.5, 0, 10, 10], "label": "a", "img_idx": 0}),
    ("zoom", {"bbox_2d": [0, 0, 10, 10], "label": "a", "img_idx": 1}),  # only image 0 exists
    ("zoom", {"bbox_2d": [0, 0, 10, 10], "label": "x" * (MAX_LABEL_CHARS + 1), "img_idx": 0}),
])
def test_the_schema_refuses_bad_arguments(action: str, args: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(args, ACTIONS[action].arguments_schema(1))


@pytest.mark.parametrize(("args", "n_images", "fragment"), [
    ({"bbox_2d": [500, 0, 100, 10], "label": "a", "img_idx": 0}, 1, "x1 < x2"),
    ({"bbox_2d": [0, 10, 10, 10], "label": "a", "img_idx": 0}, 1, "y1 < y2"),
    ({"bbox_2d": [0, 0, 10, 10], "label": "a", "img_idx": 3}, 2, "does not exist"),
])
def test_what_no_schema_says_is_checked_after_decoding(args: dict[str, Any], n_images: int,
                                                       fragment: str) -> None:
    jsonschema.validate(args, {**ACTIONS["zoom"].arguments_schema(4)})  # schema-valid...
    with pytest.raises(ActionParseError, match=fragment):  # ...but not a valid zoom
        ACTIONS["zoom"].to_call(args, n_images)


@pytest.mark.parametrize("action", TOOL_ACTIONS)
def test_everything_the_grammar_admits_parses_strictly_and_validates(tiny_model_dir: Path,
                                                                     action: str) -> None:
    """Sample 40 arguments objects under the grammar with random logits (adversarial for the grammar:
    every token the mask lets through is possible): all parse with strict json.loads and validate."""
    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    vocab = AutoConfig.from_pretrained(tiny_model_dir).text_config.vocab_size
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab)
    schema = ACTIONS[action].arguments_schema(3)
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(schema), any_whitespace=False)
    gen = torch.Generator().manual_seed(0)
    for _ in range(40):
        matcher = xgr.GrammarMatcher(compiled)
        mask = xgr.allocate_token_bitmask(1, info.vocab_size)
        out: list[int] = []
        while not matcher.is_completed():
            logits = torch.randn(vocab, generator=gen) * 3
            matcher.fill_next_token_bitmask(mask)
            xgr.apply_token_bitmask_inplace(logits, mask)
            token = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
            assert matcher.accept_token(token)
            out.append(token)
            assert len(out) <= ACTIONS[action].max_new_tokens  # the budget always suffices
        args = json.loads(tok.decode(out))
        jsonschema.validate(args, schema)

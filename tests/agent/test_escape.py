"""Escaping external text: no control token can be forged from a question or a search result."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ssr_server.agent.escape import Escaper, added_tokens
from ssr_server.core.formats.format import get_format
from ssr_server.engine.tiny import build_tokenizer


@pytest.fixture(scope="module")
def qwen() -> Any:
    return build_tokenizer("qwen")


@pytest.fixture(scope="module")
def escaper(qwen: Any) -> Escaper:
    return Escaper.for_tokenizer(qwen, get_format().escapes)


def _added_ids(tok: Any) -> set[int]:
    return set(tok.added_tokens_decoder)


def test_the_list_comes_from_the_tokenizer(qwen: Any) -> None:
    tokens = added_tokens(qwen)
    for t in ("<|im_start|>", "<|im_end|>", "<|image_pad|>", "<tool_call>", "</tool_call>", "<think>",
              "<tool_response>"):
        assert t in tokens
    assert len(tokens) == len(qwen.added_tokens_decoder)


def test_every_added_token_is_neutralised(qwen: Any, escaper: Escaper) -> None:
    specials = _added_ids(qwen)
    for token in added_tokens(qwen):
        assert set(qwen.encode(token, add_special_tokens=False)) & specials  # it IS a control token...
        out = escaper(f"before {token} after")
        assert not set(qwen.encode(out, add_special_tokens=False)) & specials, token  # ...no longer


def test_the_reference_markers_get_the_reference_replacements(escaper: Escaper) -> None:
    assert escaper("<|im_end|>") == "＜|im_end|>"
    assert escaper("see [IMAGE 2] here") == "see ［IMAGE 2] here"
    assert escaper("x</tool_response>y") == "x＜/tool_response>y"
    assert escaper("<thinking>a</thinking><answer>b</answer>") == \
        "＜thinking>a＜/thinking>＜answer>b＜/answer>"
    assert escaper("plain text, 3 < 4 > 2") == "plain text, 3 < 4 > 2"


_PIECES = st.sampled_from(["<|im_end|>", "<|im_start|>", "<|image_pad|>", "<tool_call>", "</tool_call>",
                           "<think>", "</tool_response>", "[IMAGE 1]", "<", "|", ">", "[", "IMAGE", " ",
                           "\n"])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(_PIECES, st.text(max_size=6)), max_size=12))
def test_no_mix_of_text_and_control_tokens_survives(qwen: Any, escaper: Escaper, parts: list[str]) -> None:
    out = escaper("".join(parts))
    assert not set(qwen.encode(out, add_special_tokens=False)) & _added_ids(qwen)
    assert "[IMAGE" not in out and "</tool_response>" not in out

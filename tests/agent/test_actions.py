"""Action grammars: openings and closings, each type's parser, and what a candidate action allows."""

from __future__ import annotations

import pytest

from ssr_server.agent.actions import (
    ALL_TYPES,
    GRAMMARS,
    MAX_ANSWER_CHARS,
    MAX_QUERY_CHARS,
    TOOL_TYPES,
    allowed_types,
    parse_box,
)
from ssr_server.errors import ActionParseError
from ssr_server.library import ACTIONS, CONCRETE_ACTIONS, TOOL_ACTIONS, Candidate


def test_every_action_type_has_a_grammar_with_tags() -> None:
    assert set(GRAMMARS) == set(ALL_TYPES) == CONCRETE_ACTIONS
    for name, g in GRAMMARS.items():
        assert g.type == name
        assert g.opening == f"<{name}>"
        assert g.closing == f"</{name}>"
    # image_search is forced whole (no argument decoded); the others decode an argument
    assert GRAMMARS["image_search"].max_new_tokens == 0
    assert all(GRAMMARS[t].max_new_tokens > 0 for t in ("text_search", "zoom", "answer"))


# ---- zoom ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "box"), [
    ("[0, 0, 500, 500]", (0, 0, 500, 500)),
    ("  [10,20,30,40] ", (10, 20, 30, 40)),
    ("[0.4, 1.6, 999.5, 1000]", (0, 2, 1000, 1000)),  # rounded (999.5 -> 1000, banker's rounding)
    ("[ 100 , 200 , 300 , 400 ]", (100, 200, 300, 400)),
])
def test_zoom_parses_valid_boxes(text: str, box: tuple[int, int, int, int]) -> None:
    parsed = GRAMMARS["zoom"].parse(text)
    assert parsed.type == "zoom"
    assert parsed.call is not None and parsed.call.tool == "zoom"
    assert parsed.call.box == box
    assert parse_box(text) == box


@pytest.mark.parametrize("text", [
    "", "zoom please", "[1, 2, 3]", "[1, 2, 3, 4, 5]", "(0, 0, 10, 10)", "[a, b, c, d]",
    "[0, 0, 1001, 10]", "[-1, 0, 10, 10]", "[500, 0, 400, 10]", "[0, 500, 10, 500]",
    "[0, 0, 10, 10] and more", "[1e3, 0, 10, 10]",
])
def test_zoom_refuses_invalid_boxes(text: str) -> None:
    with pytest.raises(ActionParseError) as info:
        GRAMMARS["zoom"].parse(text)
    assert "zoom" in info.value.message
    assert info.value.code == "action_parse_error"


# ---- text_search ---------------------------------------------------------------------------------
def test_text_search_query_is_stripped_and_becomes_a_call() -> None:
    parsed = GRAMMARS["text_search"].parse("  height of the Eiffel Tower \n")
    assert parsed.argument == "height of the Eiffel Tower"
    assert parsed.call is not None
    assert (parsed.call.tool, parsed.call.query) == ("text_search", "height of the Eiffel Tower")


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
def test_text_search_refuses_an_empty_query(text: str) -> None:
    with pytest.raises(ActionParseError, match="empty"):
        GRAMMARS["text_search"].parse(text)


def test_text_search_query_length_limit() -> None:
    ok = "a" * MAX_QUERY_CHARS
    assert GRAMMARS["text_search"].parse(ok).argument == ok
    with pytest.raises(ActionParseError, match=str(MAX_QUERY_CHARS)):
        GRAMMARS["text_search"].parse("a" * (MAX_QUERY_CHARS + 1))


# ---- image_search --------------------------------------------------------------------------------
def test_image_search_without_argument_means_the_latest_image() -> None:
    for text in ("", "  ", "\n"):
        parsed = GRAMMARS["image_search"].parse(text)
        assert parsed.call is not None
        assert (parsed.call.tool, parsed.call.image_index) == ("image_search", -1)


@pytest.mark.parametrize(("text", "index"), [("1", 0), (" 2 ", 1), ("12", 11)])
def test_image_search_image_number_is_one_based(text: str, index: int) -> None:
    parsed = GRAMMARS["image_search"].parse(text)
    assert parsed.call is not None and parsed.call.image_index == index


@pytest.mark.parametrize("text", ["cat", "1 2", "-1", "123", "1.5", "image 1"])
def test_image_search_refuses_other_arguments(text: str) -> None:
    with pytest.raises(ActionParseError):
        GRAMMARS["image_search"].parse(text)


# ---- answer --------------------------------------------------------------------------------------
def test_answer_is_stripped_and_capped_and_has_no_tool_call() -> None:
    parsed = GRAMMARS["answer"].parse("  Paris \n")
    assert (parsed.type, parsed.argument, parsed.call) == ("answer", "Paris", None)
    long = GRAMMARS["answer"].parse("x" * (MAX_ANSWER_CHARS + 50))
    assert len(long.argument) == MAX_ANSWER_CHARS


def test_answer_refuses_empty() -> None:
    with pytest.raises(ActionParseError, match="empty"):
        GRAMMARS["answer"].parse("  ")


# ---- what a candidate allows ---------------------------------------------------------------------
def test_allowed_types_for_tool_and_any() -> None:
    assert set(allowed_types("tool")) == set(TOOL_TYPES) == TOOL_ACTIONS
    assert "answer" not in allowed_types("tool")
    assert set(allowed_types("any")) == set(ALL_TYPES) == CONCRETE_ACTIONS
    for t in ALL_TYPES:
        assert allowed_types(t) == (t,)
        assert t in GRAMMARS


@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_allowed_types_agree_with_the_library_definition(action: str) -> None:
    cand = Candidate(id="c", text="Some rationale.", action=action)  # type: ignore[arg-type]
    assert set(allowed_types(action)) == set(cand.allowed_actions)
    assert all(t in GRAMMARS for t in allowed_types(action))

"""The default prompt format: the SSR reference harness's prompt and action format, as data."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import xgrammar as xgr

from ssr_server.core.errors import LibraryError
from ssr_server.core.formats.format import get_format, load_format
from ssr_server.core.library import Library, LibraryRegistry

# sha256 of the system prompt the reference harness (zfy0314/ssr-unofficial, src/ssr/library.py
# render_system_prompt) renders for its default reasoning_library.json: reasoning_instructions.txt
# filled with the six strategies sorted by id, then system_prompt.txt (4,375 characters).
REFERENCE_SYSTEM_PROMPT_SHA256 = "91d0f01f2308f210b29e1b4ce0d898809d25c4321d6237847b798f7a9e0d769d"


@pytest.fixture(scope="module")
def default() -> Library:
    return LibraryRegistry().get("default")


def test_system_prompt_is_the_reference_harness_prompt(default: Library) -> None:
    text = get_format().system_prompt(default)
    assert len(text) == 4375
    assert hashlib.sha256(text.encode()).hexdigest() == REFERENCE_SYSTEM_PROMPT_SHA256
    # the parts the issue names: the numbered strategies with their expected actions, the instruction
    # to copy verbatim, the role/output-format section and the three function signatures
    assert text.startswith("You reason step-by-step using one of the following 6 reasoning strategies.")
    assert '[3] "I cannot confidently tell' in text and "(expected action: image_search_tool)" in text
    assert "VERBATIM inside <thinking>...</thinking>" in text
    tools = [json.loads(line) for line in text.split("<tools>\n")[1].split("\n</tools>")[0].splitlines()]
    assert [t["function"]["name"] for t in tools] == ["image_zoom_in_tool", "text_search_tool",
                                                       "image_search_tool"]
    assert tools[0]["function"]["parameters"]["required"] == ["bbox_2d", "label", "img_idx"]


def test_strategies_are_listed_by_id_but_scored_in_library_order(default: Library) -> None:
    fmt = get_format()
    order = fmt.display_order(default)
    assert [default.candidates[i].id for i in order] == sorted(default.ids)
    surfaces = fmt.candidate_surfaces(default)
    assert surfaces == tuple(f"<thinking>{c.text}</thinking>" for c in default.candidates)
    labels = fmt.candidate_surfaces(default, label_only=True)
    for shown, i in enumerate(order):  # a label is the number the prompt shows for that strategy
        assert labels[i] == f"<thinking>[{shown}]</thinking>"
        assert f'[{shown}] "{default.candidates[i].text}"' in fmt.system_prompt(default)


def test_expected_actions_of_meta_candidates() -> None:
    fmt = get_format()
    lib = Library.from_texts(["Do something useful."], action="any")
    assert fmt.expected_actions(lib.candidates[0]) == \
        "image_search_tool, text_search_tool, image_zoom_in_tool, answer"
    tools = Library.from_texts(["Use a tool."], action="tool")
    assert fmt.expected_actions(tools.candidates[0]) == \
        "image_search_tool, text_search_tool, image_zoom_in_tool"


def test_actions_are_written_as_qwen_tool_calls() -> None:
    fmt = get_format()
    call = fmt.tool_call_text("zoom", {"bbox_2d": [1, 2, 300, 400], "label": "sign", "img_idx": 0})
    assert call == ('\n<tool_call>\n{"name": "image_zoom_in_tool", "arguments": '
                    '{"bbox_2d": [1, 2, 300, 400], "label": "sign", "img_idx": 0}}\n</tool_call>')
    body = call.split("<tool_call>\n")[1].split("\n</tool_call>")[0]
    assert json.loads(body) == {"name": "image_zoom_in_tool",
                                "arguments": {"bbox_2d": [1, 2, 300, 400], "label": "sign", "img_idx": 0}}
    assert fmt.action_opening("answer") == "\n<answer>" and fmt.action_closing("answer") == ""
    assert fmt.tool_action("text_search_tool") == "text_search" and fmt.tool_action("web_browse") is None


def test_observation_turn_closes_and_reopens_the_assistant_turn() -> None:
    fmt = get_format()
    assert fmt.observation_turn("X") == ("<|im_end|>\n<|im_start|>user\n<tool_response>\nX\n</tool_response>"
                                         "<|im_end|>\n<|im_start|>assistant\n")
    assert fmt.user_content("Q?", 1, 2) == "Q?\n[IMAGE 1]\n[IMAGE 2]"


@pytest.mark.parametrize(("text", "valid"), [
    ("1931</answer>", True), ("Tresslin Bridge, 1931</answer>", True), ("a\nb</answer>", True),
    ("</answer>", False), (" 1931</answer>", False), ("<b>1931</b></answer>", False),
    ("1931</answer>x", False),
])
def test_the_answer_grammar_admits_exactly_non_empty_untagged_answers(tiny_model_dir: Path, text: str,
                                                                       valid: bool) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    info = xgr.TokenizerInfo.from_huggingface(tok)
    grammar = get_format().answer_grammar()
    assert grammar.kind == "ebnf"
    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(info).compile_grammar(grammar.source))
    accepted = matcher.accept_string(text) and matcher.is_completed()
    assert accepted is valid


def test_a_broken_format_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(LibraryError, match=r"format\.yaml"):
        load_format(tmp_path)
    shipped = Path(__file__).resolve().parents[2] / "ssr_server" / "core" / "formats" / "ssr"
    folder = tmp_path / "broken"
    folder.mkdir()
    for f in shipped.iterdir():
        (folder / f.name).write_text(f.read_text())
    data = (folder / "format.yaml").read_text().replace("  zoom: image_zoom_in_tool\n", "")
    (folder / "format.yaml").write_text(data)
    with pytest.raises(LibraryError, match="tool_names lacks"):
        load_format(folder)
    (folder / "format.yaml").write_text((shipped / "format.yaml").read_text())
    assert load_format(folder).name == "ssr"
    (folder / "system.txt").unlink()
    with pytest.raises(LibraryError, match=r"system\.txt"):
        load_format(folder)
    with pytest.raises(LibraryError, match="unknown prompt format"):
        get_format("no-such-format")

"""Rationale libraries: the shipped YAMLs, validation messages, the registry, token-id caching."""

from __future__ import annotations

import gc
import json
import textwrap
import weakref
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from ssr_server.core.actions import ALL_ACTIONS, RATIONALE_ACTIONS, TOOL_ACTIONS
from ssr_server.core.errors import InvalidRequest, LibraryError, UnknownLibrary
from ssr_server.core.library import (
    DEFAULT_LIBRARY,
    Library,
    LibraryRegistry,
    candidates_dir,
    load_library,
)
from ssr_server.core.limits import MAX_CANDIDATES

CANDIDATES_DIR = candidates_dir()
REPO = Path(__file__).resolve().parents[2]

SHIPPED = ("default", "generic-1", "binary-2")


def _train_tokenizer() -> PreTrainedTokenizerFast:
    """A tiny byte-level BPE trained on a few sentences: real HF tokenizer behaviour, no download."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=["<unk>", "<think>", "</think>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [
        "I do not yet know what this object is, so searching the web with the image should identify it.",
        "Let me think about the next step.",
        "The answer is visible in the image, so I can answer directly.",
        "Zooming into the region should let me read the small text.",
        "[1] [2] [3] [4] [5] [6]",
    ]
    tok.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return _train_tokenizer()


def _write(tmp_path: Path, body: str, name: str = "lib.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


VALID = """\
name: mini
description: two moves
candidates:
  - id: search_it
    text: I should search for this with the image.
    action: image_search
  - id: answer_it
    text: I know enough to answer now.
    action: answer
"""


# ------------------------------------------------------------------ shipped libraries


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_libraries_load(name: str) -> None:
    lib = load_library(CANDIDATES_DIR / f"{name}.yaml")
    assert lib.name == name
    assert lib.description
    assert lib.path == CANDIDATES_DIR / f"{name}.yaml"
    assert 1 <= len(lib) <= MAX_CANDIDATES
    for cand in lib.candidates:
        assert cand.action in RATIONALE_ACTIONS
        assert cand.text == cand.text.strip()
        assert "\n" not in cand.text


def test_default_library_is_the_reference_library() -> None:
    lib = LibraryRegistry().get(DEFAULT_LIBRARY)
    # the SSR reference harness's six candidates, in its order (ties go to the lowest index)
    assert lib.ids == ("r_GENERAL_KNOW", "r_ANSWER_FROM_IMAGE", "r_ZOOM_DETAIL", "r_IDENTIFY_BY_IMAGE",
                       "r_LOOKUP_FACT", "r_ANSWER_FROM_EVIDENCE")
    assert [c.action for c in lib.candidates] == ["answer", "answer", "zoom", "image_search", "text_search",
                                                  "answer"]
    for cand in lib.candidates:
        assert 20 <= len(cand.text.split()) <= 35, cand.text


def test_the_shipped_libraries_live_at_the_top_level() -> None:
    """Users find and edit them in candidates/; installed, they are the package ssr_server.candidates."""
    assert CANDIDATES_DIR.resolve() == (REPO / "candidates").resolve()
    assert {p.stem for p in (REPO / "candidates").glob("*.yaml")} == set(SHIPPED)


def test_the_reference_harness_json_layout_loads(tmp_path: Path) -> None:
    path = tmp_path / "harness.json"
    path.write_text(json.dumps({"name": "ssr-reasoning-library", "version": "v0", "entries": {
        "r_LOOK": {"text": "I should look it up.", "expected_actions": ["text_search_tool"]},
        "r_ANY_TOOL": {"text": "Some tool will help.", "expected_actions": [
            "image_search_tool", "text_search_tool", "image_zoom_in_tool"]},
        "r_ANYTHING": {"text": "Let me decide.", "expected_actions": ["answer", "image_zoom_in_tool"]},
        "r_DONE": {"text": "I can answer now.", "expected_actions": ["answer"]},
    }}))
    lib = load_library(path)
    assert lib.name == "ssr-reasoning-library"
    assert lib.ids == ("r_LOOK", "r_ANY_TOOL", "r_ANYTHING", "r_DONE")
    assert [c.action for c in lib.candidates] == ["text_search", "tool", "any", "answer"]
    reg = LibraryRegistry(extra_dirs=[tmp_path])
    assert reg.get("ssr-reasoning-library") == lib
    path.write_text(json.dumps({"entries": {"r_X": {"text": "Hm.", "expected_actions": ["dance"]}}}))
    with pytest.raises(LibraryError, match="expected_actions"):
        load_library(path)
    path.write_text("{not json")
    with pytest.raises(LibraryError, match="invalid JSON"):
        load_library(path)


def test_ablation_libraries() -> None:
    reg = LibraryRegistry()
    (generic,) = reg.get("generic-1").candidates
    assert generic.action == "any"
    assert generic.allowed_actions == ALL_ACTIONS
    binary = reg.get("binary-2").candidates
    assert [c.action for c in binary] == ["answer", "tool"]
    assert binary[0].allowed_actions == ("answer",)
    assert binary[1].allowed_actions == TOOL_ACTIONS


# ------------------------------------------------------------------ registry


def test_registry_names_and_unknown() -> None:
    reg = LibraryRegistry()
    assert reg.names() == tuple(sorted(SHIPPED))
    assert "default" in reg
    assert len(reg) == 3
    with pytest.raises(UnknownLibrary) as info:
        reg.get("nope")
    assert "nope" in info.value.message
    for name in SHIPPED:
        assert name in info.value.message


def test_registry_extra_dirs(tmp_path: Path) -> None:
    _write(tmp_path, VALID)
    reg = LibraryRegistry([tmp_path])
    assert reg.names() == tuple(sorted((*SHIPPED, "mini")))
    assert reg.get("mini").path == tmp_path / "lib.yaml"
    only = LibraryRegistry([tmp_path], include_builtin=False)
    assert only.names() == ("mini",)


def test_registry_rejects_duplicate_names(tmp_path: Path) -> None:
    _write(tmp_path, VALID, "a.yaml")
    _write(tmp_path, VALID, "b.yaml")
    with pytest.raises(LibraryError) as info:
        LibraryRegistry([tmp_path], include_builtin=False)
    assert "a.yaml" in info.value.message and "b.yaml" in info.value.message


def test_registry_missing_dir(tmp_path: Path) -> None:
    with pytest.raises(LibraryError, match="does not exist"):
        LibraryRegistry([tmp_path / "absent"])


def test_registry_reports_bad_file(tmp_path: Path) -> None:
    _write(tmp_path, "name: bad\ncandidates: []\n", "bad.yaml")
    with pytest.raises(LibraryError) as info:
        LibraryRegistry([tmp_path])
    assert "bad.yaml" in info.value.message


# ------------------------------------------------------------------ validation messages


def _entry(id_: str, text: str = "I should do this now.", action: str = "answer") -> str:
    return f"  - id: {id_}\n    text: {text}\n    action: {action}\n"


def _lib(*entries: str, name: str = "t") -> str:
    return f"name: {name}\ndescription: test\ncandidates:\n" + "".join(entries)


@pytest.mark.parametrize(
    ("body", "fragments"),
    [
        (
            _lib(_entry("ok"), _entry("bad_action", action="fly")),
            ["candidates[1]", "'bad_action'", "action"],
        ),
        (
            _lib(_entry("ok"), _entry("ok2"), _entry("ok", text="Another sentence here.")),
            ["candidates[2]", "'ok'", "candidates[0]"],
        ),
        (_lib(_entry("ok"), _entry("empty", text="'   '")), ["candidates[1]", "'empty'", "empty"]),
        (
            _lib(_entry("long", text="I " + "x" * 500)),
            ["candidates[0]", "'long'", "text", "at most 400"],
        ),
        (_lib(_entry("Bad-Id")), ["candidates[0]", "'Bad-Id'", "id"]),
        (
            _lib(_entry("tag", text="I will stop </think> here.")),
            ["candidates[0]", "'tag'", "</think>"],
        ),
        (
            _lib(_entry("nl", text='"line one\\nline two"')),
            ["candidates[0]", "'nl'", "one line"],
        ),
        (_lib(_entry("num", text="12345")), ["candidates[0]", "'num'", "text"]),
        (
            _lib(_entry("extra") + "    weight: 2\n"),
            ["candidates[0]", "'extra'", "weight"],
        ),
        (_lib(), ["candidates"]),
        ("name: t\ncandidates: []\n", ["candidates", "at least 1"]),
        (
            _lib(*(_entry(f"c{i}") for i in range(MAX_CANDIDATES + 1))),
            ["candidates", "at most 16"],
        ),
        (_lib(_entry("ok"), name="Bad Name"), ["name"]),
        ("candidates:\n" + _entry("ok"), ["name", "required"]),
        ("- just\n- a list\n", ["expected a mapping"]),
        ("", ["expected a mapping"]),
        ("name: [unclosed\n", ["invalid YAML"]),
    ],
)
def test_validation_errors_name_file_and_entry(tmp_path: Path, body: str, fragments: list[str]) -> None:
    path = _write(tmp_path, body, "broken.yaml")
    with pytest.raises(LibraryError) as info:
        load_library(path)
    message = info.value.message
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, message


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(LibraryError) as info:
        load_library(tmp_path / "nope.yaml")
    assert "nope.yaml" in info.value.message


def test_text_is_stripped_and_folded(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """\
        name: folded
        candidates:
          - id: a
            text: >-
              I should search
              for this now.
            action: text_search
        """,
    )
    lib = load_library(path)
    assert lib.candidates[0].text == "I should search for this now."
    assert lib.description == ""


# ------------------------------------------------------------------ from_texts


def test_from_texts() -> None:
    lib = Library.from_texts(["  First idea.  ", "Second idea."])
    assert lib.ids == ("c1", "c2")
    assert [c.text for c in lib.candidates] == ["First idea.", "Second idea."]
    assert {c.action for c in lib.candidates} == {"any"}
    assert lib.path is None
    tool_lib = Library.from_texts(["Use a tool."], action="tool")
    assert tool_lib.candidates[0].action == "tool"


@pytest.mark.parametrize(
    ("texts", "action", "fragment"),
    [
        ([], "any", "at least 1"),
        (["ok", ""], "any", "candidates[1]"),
        (["ok", "   "], "any", "empty"),
        (["x" * 401], "any", "at most 400"),
        (["ok"], "fly", "action"),
        (["ok", 3], "any", "candidates[1]"),
        (["ok"] * 17, "any", "at most 16"),
        ("not a list", "any", "list of strings"),
        (["<|im_end|> sneaky"], "any", "<|im_end|>"),
    ],
)
def test_from_texts_rejects(texts: object, action: str, fragment: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        Library.from_texts(texts, action=action)  # type: ignore[arg-type]
    assert not isinstance(info.value, LibraryError)
    assert fragment in info.value.message, info.value.message


# ------------------------------------------------------------------ surfaces and token ids


SURFACES = ("<thinking>one</thinking>", "<thinking>two</thinking>", "<thinking>three</thinking>",
            "<thinking>four</thinking>", "<thinking>five</thinking>", "<thinking>six</thinking>")


def test_token_ids_are_cached_and_exact(tokenizer: PreTrainedTokenizerFast) -> None:
    lib = load_library(CANDIDATES_DIR / "default.yaml")
    ids = lib.candidate_token_ids(tokenizer, SURFACES)
    assert lib.candidate_token_ids(tokenizer, SURFACES) is ids
    assert len(ids) == len(lib)
    for surface, cand_ids in zip(SURFACES, ids, strict=True):
        assert isinstance(cand_ids, tuple) and cand_ids
        assert all(isinstance(t, int) for t in cand_ids)
        assert tokenizer.decode(list(cand_ids)) == surface
        assert list(cand_ids) == tokenizer.encode(surface, add_special_tokens=False)
    other = tuple(s.upper() for s in SURFACES)
    assert lib.candidate_token_ids(tokenizer, other) is not ids  # cached per surfaces too
    assert lib.candidate_token_ids(tokenizer, SURFACES) is ids
    with pytest.raises(ValueError, match="surfaces"):
        lib.candidate_token_ids(tokenizer, SURFACES[:2])


def test_cache_is_per_tokenizer_and_per_library(tokenizer: PreTrainedTokenizerFast) -> None:
    lib = load_library(CANDIDATES_DIR / "binary-2.yaml")
    other_tok = _train_tokenizer()
    surfaces = ("Answer now.", "Use a tool.")
    a = lib.candidate_token_ids(tokenizer, surfaces)
    b = lib.candidate_token_ids(other_tok, surfaces)
    assert a is not b
    assert a == b  # same training data, same ids
    assert lib.candidate_token_ids(other_tok, surfaces) is b  # cached for that tokenizer too
    # a second Library object with the same content has its own cache but compares equal
    twin = load_library(CANDIDATES_DIR / "binary-2.yaml")
    assert twin == lib
    assert twin.candidate_token_ids(tokenizer, surfaces) == a
    # the cache never keeps a tokenizer alive (entries are dropped with their tokenizer)
    alive = weakref.ref(other_tok)
    del other_tok, b
    gc.collect()
    assert alive() is None
    assert lib.candidate_token_ids(tokenizer, surfaces) is a


class _NoWeakrefTokenizer:
    """A TokenizerLike without weak-reference support (``__slots__`` and no ``__weakref__``)."""

    __slots__ = ("calls",)

    def __init__(self) -> None:
        self.calls = 0

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        self.calls += 1
        return [ord(ch) for ch in text]

    def decode(self, ids: object, skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids)  # type: ignore[attr-defined]

    def convert_tokens_to_ids(self, tokens: str) -> int:
        return 0


def test_cache_works_without_weakrefs() -> None:
    lib = Library.from_texts(["Alpha.", "Beta."])
    tok = _NoWeakrefTokenizer()
    ids = lib.candidate_token_ids(tok, ("Alpha.", "Beta."))
    assert ids == (tuple(map(ord, "Alpha.")), tuple(map(ord, "Beta.")))
    calls = tok.calls
    assert lib.candidate_token_ids(tok, ("Alpha.", "Beta.")) is ids
    assert tok.calls == calls  # computed once

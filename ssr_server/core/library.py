"""Rationale libraries: the fixed sets of short rationales an SSR agent selects from.

A library is a YAML file (see ``candidates/default.yaml`` for the commented format) with a ``name``, a
``description`` and 1..16 ``candidates``, each an ``id``, one sentence of ``text`` and the ``action``
the model decodes after the rationale is pasted (a row of ``ssr_server.core.actions``: a concrete
action, or ``tool`` / ``any`` for the ablations where the model decodes which). The SSR reference
harness's JSON layout (``{"entries": {id: {"text", "expected_actions": [...]}}}``) loads too.

What gets scored is exactly what gets pasted: the prompt format turns candidates into their surfaces
(``PromptFormat.candidate_surfaces``) and ``Library.candidate_token_ids`` tokenizes those surfaces once
per tokenizer, so the ids the engine scored are the ids the agent appends to the context.
"""

from __future__ import annotations

import json
import re
import threading
import unicodedata
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from ssr_server.core.actions import RATIONALE_ACTIONS, TOOL_ACTIONS, RationaleAction, allowed_actions
from ssr_server.core.errors import InvalidRequest, LibraryError, UnknownLibrary
from ssr_server.core.limits import MAX_CANDIDATE_CHARS, MAX_CANDIDATES

__all__ = [
    "DEFAULT_LIBRARY",
    "Candidate",
    "Library",
    "LibraryRegistry",
    "SupportsEncode",
    "candidates_dir",
    "load_library",
]

MAX_NAME_CHARS = 64
DEFAULT_LIBRARY = "default"

_ID_PATTERN = r"^[A-Za-z][A-Za-z0-9_]*$"
_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]*$"
# Chat-template / action tags such as <think>, </think>, <|im_end|>, <tool_call>: a rationale that
# contained one could close the reasoning block or fake an action. Plain "x > 3" stays allowed.
_TAG_RE = re.compile(r"<\|?/?[A-Za-z_][\w.|-]*\|?>")


class SupportsEncode(Protocol):
    """All ``candidate_token_ids`` needs of a tokenizer (a transformers tokenizer satisfies it)."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


# --------------------------------------------------------------------------------------------------
# Public records
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    id: str
    text: str
    action: RationaleAction

    @property
    def allowed_actions(self) -> tuple[str, ...]:
        """The concrete actions the model may take after this rationale (see ``allowed_actions``)."""
        return allowed_actions(self.action)


TokenIds = tuple[tuple[int, ...], ...]


class _TokenCache:
    """Token ids of a library's surfaces, computed once per tokenizer object.

    Keyed by ``id(tokenizer)``. An id can be reused after its object dies, so each entry also holds a
    reference to the tokenizer: a weak one (with a callback that drops the entry when the tokenizer is
    collected) when the tokenizer supports weak references, otherwise a strong one (keeping it alive,
    so its id cannot be reused while the entry exists). A hit also checks identity.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()  # re-entrant: a weakref callback may fire during a compute
        self._entries: dict[int, tuple[Callable[[], object], dict[tuple[str, ...], TokenIds]]] = {}

    def get(self, tokenizer: SupportsEncode, surfaces: tuple[str, ...],
            compute: Callable[[], TokenIds]) -> TokenIds:
        key = id(tokenizer)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry[0]() is not tokenizer:
                entry = (self._reference(tokenizer, key), {})
                self._entries[key] = entry
            ids = entry[1].get(surfaces)
            if ids is None:
                ids = compute()
                entry[1][surfaces] = ids
            return ids

    def _reference(self, tokenizer: SupportsEncode, key: int) -> Callable[[], object]:
        cache_ref = weakref.ref(self)

        def drop(dead: object) -> None:
            cache = cache_ref()
            if cache is not None:
                with cache._lock:
                    current = cache._entries.get(key)
                    if current is not None and current[0] is dead:
                        del cache._entries[key]

        try:
            return weakref.ref(tokenizer, drop)
        except TypeError:  # not weak-referenceable: hold it strongly
            return lambda: tokenizer

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


@dataclass(frozen=True)
class Library:
    name: str
    description: str
    candidates: tuple[Candidate, ...]
    path: Path | None = None
    _token_cache: _TokenCache = field(
        default_factory=_TokenCache, init=False, repr=False, compare=False, hash=False
    )

    def __len__(self) -> int:
        return len(self.candidates)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(c.id for c in self.candidates)

    def candidate_token_ids(self, tokenizer: SupportsEncode, surfaces: tuple[str, ...]) -> TokenIds:
        """Token ids of every candidate's ``surfaces`` entry (the prompt format writes them; no special
        tokens added), cached per tokenizer object and surfaces.

        The same tuple object is returned on every call with the same tokenizer and surfaces; paste
        these ids, never re-tokenize the text, so what is scored is what is pasted.
        """
        if len(surfaces) != len(self.candidates):
            raise ValueError(f"{len(surfaces)} surfaces for {len(self.candidates)} candidates")

        def compute() -> TokenIds:
            out: list[tuple[int, ...]] = []
            for i, surface in enumerate(surfaces):
                ids = tuple(int(t) for t in tokenizer.encode(surface, add_special_tokens=False))
                if not ids:
                    raise LibraryError(
                        f"library {self.name!r}: candidate {i} (id {self.candidates[i].id!r}) "
                        "tokenizes to no tokens"
                    )
                out.append(ids)
            return tuple(out)

        return self._token_cache.get(tokenizer, surfaces, compute)

    @classmethod
    def from_texts(
        cls,
        texts: Sequence[str],
        action: str = "any",
        *,
        name: str = "custom",
        description: str = "Ad-hoc candidates sent with the request.",
    ) -> Library:
        """A library from rationale texts sent by an API client; ids are ``c1``, ``c2``, ...

        Validated exactly like a YAML file; problems raise ``InvalidRequest``.
        """
        if isinstance(texts, str | bytes) or not isinstance(texts, Sequence):
            raise InvalidRequest("candidates: expected a list of strings")
        if action not in RATIONALE_ACTIONS:
            allowed = ", ".join(sorted(RATIONALE_ACTIONS))
            raise InvalidRequest(f"action: must be one of {allowed}; got {action!r}")
        data = {
            "name": name,
            "description": description,
            "candidates": [{"id": f"c{i + 1}", "text": t, "action": action} for i, t in enumerate(texts)],
        }
        try:
            model = _LibraryModel.model_validate(data)
        except ValidationError as exc:
            raise InvalidRequest(_format_errors("candidates", exc, data)) from None
        return model.to_library(None)


# --------------------------------------------------------------------------------------------------
# Validation (pydantic)
# --------------------------------------------------------------------------------------------------


class _CandidateModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    id: str = Field(pattern=_ID_PATTERN, min_length=1, max_length=MAX_NAME_CHARS)
    text: str
    action: RationaleAction

    @field_validator("text")
    @classmethod
    def _check_text(cls, value: str) -> str:
        text = value.strip()
        if not text:
            raise PydanticCustomError("empty_text", "text must not be empty")
        if len(text) > MAX_CANDIDATE_CHARS:
            raise PydanticCustomError(
                "text_too_long",
                "text has {length} characters, at most {limit} allowed",
                {"length": len(text), "limit": MAX_CANDIDATE_CHARS},
            )
        if any(unicodedata.category(ch) == "Cc" for ch in text):
            raise PydanticCustomError(
                "text_control_chars", "text must be one line without control characters"
            )
        tag = _TAG_RE.search(text)
        if tag is not None:
            raise PydanticCustomError(
                "text_tag", "text must not contain markup tags such as {tag}", {"tag": tag.group(0)}
            )
        return text


class _LibraryModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(pattern=_NAME_PATTERN, min_length=1, max_length=MAX_NAME_CHARS)
    description: str = ""
    candidates: list[_CandidateModel] = Field(min_length=1, max_length=MAX_CANDIDATES)

    @field_validator("candidates")
    @classmethod
    def _unique_ids(cls, value: list[_CandidateModel]) -> list[_CandidateModel]:
        first: dict[str, int] = {}
        for i, cand in enumerate(value):
            if cand.id in first:
                raise PydanticCustomError(
                    "duplicate_id",
                    "candidates[{index}] (id '{id}') repeats the id of candidates[{first}]",
                    {"index": i, "id": cand.id, "first": first[cand.id]},
                )
            first[cand.id] = i
        return value

    def to_library(self, path: Path | None) -> Library:
        return Library(
            name=self.name,
            description=self.description.strip(),
            candidates=tuple(Candidate(id=c.id, text=c.text, action=c.action) for c in self.candidates),
            path=path,
        )


def _format_errors(source: str, exc: ValidationError, data: object, limit: int = 10) -> str:
    """One message naming the source and, for each problem, the entry index and id."""
    raw_candidates: object = data.get("candidates") if isinstance(data, Mapping) else None
    parts: list[str] = []
    errors = exc.errors(include_url=False)
    for err in errors[:limit]:
        loc = list(err["loc"])
        where = ""
        if len(loc) >= 2 and loc[0] == "candidates" and isinstance(loc[1], int):
            index = loc[1]
            where = f"candidates[{index}]"
            entry = (
                raw_candidates[index]
                if isinstance(raw_candidates, list) and 0 <= index < len(raw_candidates)
                else None
            )
            entry_id = entry.get("id") if isinstance(entry, Mapping) else None
            if isinstance(entry_id, str | int):
                where += f" (id {entry_id!r})"
            loc = loc[2:]
        field_path = ".".join(str(p) for p in loc)
        if field_path:
            where = f"{where}: {field_path}" if where else field_path
        parts.append(f"{where}: {err['msg']}" if where else str(err["msg"]))
    if len(errors) > limit:
        parts.append(f"... and {len(errors) - limit} more")
    return f"{source}: " + "; ".join(parts)


# --------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------


def candidates_dir() -> Path:
    """The shipped libraries: the top-level ``candidates/`` folder, installed as ``ssr_server.candidates``."""
    from importlib.resources import files

    return Path(str(files("ssr_server.candidates")))


# The reference harness names tools in ``expected_actions``; ours are the action table's names.
_HARNESS_ACTIONS = {"image_search_tool": "image_search", "text_search_tool": "text_search",
                    "image_zoom_in_tool": "zoom", "answer": "answer"}


def _from_harness(data: Mapping[str, Any], stem: str) -> dict[str, Any]:
    """The harness layout ``{"entries": {id: {"text", "expected_actions"}}}`` as our library data.

    One expected action maps to that action; the three tools together to ``tool``; tools and the
    answer together to ``any`` (the model decodes which, as in the reference, where expected actions
    are metadata only)."""
    entries = data.get("entries")
    if not isinstance(entries, Mapping) or not entries:
        raise LibraryError(f"{stem}: a harness library needs a non-empty 'entries' object")
    candidates = []
    for cid, entry in entries.items():
        raw = entry.get("expected_actions") if isinstance(entry, Mapping) else None
        if not isinstance(raw, list) or not raw or not all(a in _HARNESS_ACTIONS for a in raw):
            raise LibraryError(f"{stem}: entry {cid!r}: expected_actions must list some of "
                               f"{sorted(_HARNESS_ACTIONS)}")
        acts = {_HARNESS_ACTIONS[a] for a in raw}
        action = (acts.pop() if len(acts) == 1 else "tool" if acts == set(TOOL_ACTIONS)
                  else "any")
        candidates.append({"id": cid, "text": entry.get("text"), "action": action})
    name = data.get("name")
    return {"name": name if isinstance(name, str) and re.fullmatch(_NAME_PATTERN, name) else stem,
            "description": str(data.get("note", data.get("description", ""))), "candidates": candidates}


def load_library(path: str | Path) -> Library:
    """Load and validate one library file (YAML, or JSON in our layout or the SSR harness's);
    any problem raises ``LibraryError`` naming the file."""
    p = Path(path)
    try:
        raw_text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LibraryError(f"{p}: cannot read library file: {exc}") from None
    try:
        data: Any = json.loads(raw_text) if p.suffix == ".json" else yaml.safe_load(raw_text)
    except (yaml.YAMLError, ValueError) as exc:
        raise LibraryError(f"{p}: invalid {'JSON' if p.suffix == '.json' else 'YAML'}: {exc}") from None
    if not isinstance(data, Mapping):
        raise LibraryError(
            f"{p}: expected a mapping with keys name, description, candidates; got {type(data).__name__}"
        )
    if "entries" in data and "candidates" not in data:
        data = _from_harness(data, p.stem)
    try:
        model = _LibraryModel.model_validate(dict(data))
    except ValidationError as exc:
        raise LibraryError(_format_errors(str(p), exc, data)) from None
    return model.to_library(p)


class LibraryRegistry:
    """Every library the server knows, by name.

    Loads each ``*.yaml`` and ``*.json`` in the shipped candidates directory (unless ``include_builtin``
    is false) and then in each of ``extra_dirs``, in sorted file order. Two files declaring the same
    ``name`` are an error (``LibraryError`` naming both files): to change a shipped library, give yours a
    new name.
    """

    def __init__(self, extra_dirs: Iterable[str | Path] = (), *, include_builtin: bool = True) -> None:
        dirs: list[Path] = [candidates_dir()] if include_builtin else []
        dirs.extend(Path(d) for d in extra_dirs)
        self._libraries: dict[str, Library] = {}
        for directory in dirs:
            if not directory.is_dir():
                raise LibraryError(f"{directory}: library directory does not exist")
            for file in sorted([*directory.glob("*.yaml"), *directory.glob("*.json")]):
                self.add(load_library(file))

    def add(self, library: Library) -> None:
        existing = self._libraries.get(library.name)
        if existing is not None:
            raise LibraryError(
                f"{library.path}: library name {library.name!r} is already defined by {existing.path}"
            )
        self._libraries[library.name] = library

    def get(self, name: str) -> Library:
        try:
            return self._libraries[name]
        except KeyError:
            available = ", ".join(self.names()) or "(none)"
            raise UnknownLibrary(f"unknown library {name!r}; available: {available}") from None

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._libraries))

    def __contains__(self, name: object) -> bool:
        return name in self._libraries

    def __len__(self) -> int:
        return len(self._libraries)

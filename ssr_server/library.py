"""Rationale libraries: the fixed sets of short rationales an SSR agent selects from.

A library is a YAML file (see ``ssr_server/candidates/default.yaml`` for the commented format) with a
``name``, a ``description`` and 1..16 ``candidates``, each an ``id``, one sentence of ``text`` and the
``action`` the model decodes after the rationale is pasted:

* ``image_search`` / ``text_search`` / ``zoom`` / ``answer``: a concrete move; the agent forces that
  action's opening and the model decodes only its argument.
* ``tool``: "use some tool"; the model decodes which of the tool actions (not ``answer``).
* ``any``: nothing is forced; the model decodes the action opening itself (any tool, or answer).

``Candidate.allowed_actions`` spells this out for the agent.

What gets scored is exactly what gets pasted: ``candidate_surface`` is the single definition of a
candidate's text as it appears inside the model's ``<think>`` block (the text followed by ``"\\n"``,
or the index label ``"[i]\\n"`` in the label-only ablation), and ``Library.candidate_token_ids``
tokenizes those surfaces once per tokenizer, so the ids the engine scored are the ids the agent
appends to the context.
"""

from __future__ import annotations

import re
import threading
import unicodedata
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from ssr_server.errors import InvalidRequest, LibraryError, UnknownLibrary

__all__ = [
    "ACTIONS",
    "CANDIDATES_DIR",
    "CONCRETE_ACTIONS",
    "DEFAULT_LIBRARY",
    "MAX_CANDIDATES",
    "MAX_TEXT_CHARS",
    "SURFACE_SUFFIX",
    "TOOL_ACTIONS",
    "ActionKind",
    "Candidate",
    "Library",
    "LibraryRegistry",
    "SupportsEncode",
    "candidate_surface",
    "load_library",
]

ActionKind = Literal["image_search", "text_search", "zoom", "answer", "any", "tool"]
ACTIONS: frozenset[str] = frozenset(get_args(ActionKind))
TOOL_ACTIONS: frozenset[str] = frozenset({"image_search", "text_search", "zoom"})
# The concrete actions the model may end up taking (what ``any`` allows).
CONCRETE_ACTIONS: frozenset[str] = TOOL_ACTIONS | {"answer"}

MAX_CANDIDATES = 16
MAX_TEXT_CHARS = 400
MAX_NAME_CHARS = 64
SURFACE_SUFFIX = "\n"

CANDIDATES_DIR = Path(__file__).resolve().parent / "candidates"
DEFAULT_LIBRARY = "default"

_ID_PATTERN = r"^[a-z][a-z0-9_]*$"
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
    action: ActionKind

    @property
    def allowed_actions(self) -> frozenset[str]:
        """The concrete actions the model may take after this rationale.

        A concrete action allows only itself (the agent forces its opening); ``tool`` allows the three
        tools (the model decodes which); ``any`` allows every tool and ``answer``.
        """
        if self.action == "any":
            return CONCRETE_ACTIONS
        if self.action == "tool":
            return TOOL_ACTIONS
        return frozenset({self.action})


def candidate_surface(candidate: Candidate, index: int, label_only: bool = False) -> str:
    """The exact text of candidate ``index`` (0-based) as it appears inside the ``<think>`` block.

    The agent writes ``"<think>\\n"``, then the chosen surface, then closes the block; the surface is
    ``candidate.text + "\\n"``, or ``"[index+1]\\n"`` when only the labels are scored (ablation). This
    one function is used both to tokenize for scoring and to display, so the two cannot drift.
    """
    if index < 0:
        raise ValueError(f"candidate index must be >= 0, got {index}")
    if label_only:
        return f"[{index + 1}]{SURFACE_SUFFIX}"
    return f"{candidate.text}{SURFACE_SUFFIX}"


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
        self._entries: dict[int, tuple[Callable[[], object], dict[bool, TokenIds]]] = {}

    def get(self, tokenizer: SupportsEncode, label_only: bool, compute: Callable[[], TokenIds]) -> TokenIds:
        key = id(tokenizer)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry[0]() is not tokenizer:
                entry = (self._reference(tokenizer, key), {})
                self._entries[key] = entry
            ids = entry[1].get(label_only)
            if ids is None:
                ids = compute()
                entry[1][label_only] = ids
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

    def surfaces(self, label_only: bool = False) -> tuple[str, ...]:
        return tuple(candidate_surface(c, i, label_only) for i, c in enumerate(self.candidates))

    def candidate_token_ids(self, tokenizer: SupportsEncode, label_only: bool = False) -> TokenIds:
        """Token ids of every candidate surface (no special tokens), cached per tokenizer object.

        The same tuple object is returned on every call with the same tokenizer and ``label_only``;
        paste these ids, never re-tokenize the text, so what is scored is what is pasted.
        """

        def compute() -> TokenIds:
            out: list[tuple[int, ...]] = []
            for i, surface in enumerate(self.surfaces(label_only)):
                ids = tuple(int(t) for t in tokenizer.encode(surface, add_special_tokens=False))
                if not ids:
                    raise LibraryError(
                        f"library {self.name!r}: candidate {i} (id {self.candidates[i].id!r}) "
                        "tokenizes to no tokens"
                    )
                out.append(ids)
            return tuple(out)

        return self._token_cache.get(tokenizer, label_only, compute)

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
        if action not in ACTIONS:
            raise InvalidRequest(f"action: must be one of {', '.join(sorted(ACTIONS))}; got {action!r}")
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
    action: ActionKind

    @field_validator("text")
    @classmethod
    def _check_text(cls, value: str) -> str:
        text = value.strip()
        if not text:
            raise PydanticCustomError("empty_text", "text must not be empty")
        if len(text) > MAX_TEXT_CHARS:
            raise PydanticCustomError(
                "text_too_long",
                "text has {length} characters, at most {limit} allowed",
                {"length": len(text), "limit": MAX_TEXT_CHARS},
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


def load_library(path: str | Path) -> Library:
    """Load and validate one library YAML file; any problem raises ``LibraryError`` naming the file."""
    p = Path(path)
    try:
        raw_text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LibraryError(f"{p}: cannot read library file: {exc}") from None
    try:
        data: Any = yaml.safe_load(raw_text)
    except yaml.YAMLError as exc:
        raise LibraryError(f"{p}: invalid YAML: {exc}") from None
    if not isinstance(data, Mapping):
        raise LibraryError(
            f"{p}: expected a mapping with keys name, description, candidates; got {type(data).__name__}"
        )
    try:
        model = _LibraryModel.model_validate(dict(data))
    except ValidationError as exc:
        raise LibraryError(_format_errors(str(p), exc, data)) from None
    return model.to_library(p)


class LibraryRegistry:
    """Every library the server knows, by name.

    Loads each ``*.yaml`` in the shipped candidates directory (unless ``include_builtin`` is false) and
    then in each of ``extra_dirs``, in sorted file order. Two files declaring the same ``name`` are an
    error (``LibraryError`` naming both files): to change a shipped library, give yours a new name.
    """

    def __init__(self, extra_dirs: Iterable[str | Path] = (), *, include_builtin: bool = True) -> None:
        dirs: list[Path] = [CANDIDATES_DIR] if include_builtin else []
        dirs.extend(Path(d) for d in extra_dirs)
        self._libraries: dict[str, Library] = {}
        for directory in dirs:
            if not directory.is_dir():
                raise LibraryError(f"{directory}: library directory does not exist")
            for file in sorted(directory.glob("*.yaml")):
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

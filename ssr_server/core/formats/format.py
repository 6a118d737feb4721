"""A prompt format as data: everything the model reads and writes, filled in from one folder.

A format folder holds ``format.yaml`` (tags, templates, tool names, advertised tool signatures,
observation templates, escapes) and the long system-prompt texts it names. ``PromptFormat`` only fills
the templates in: the agent loop, the chat renderer, the selection route and the OpenAI route all
write through it, so a checkpoint trained on a format sees exactly that format everywhere.

Templates use ``str.format`` fields (``{text}``, ``{role}``, ...); the two long system-prompt texts use
``string.Template`` (``$tools``), because they contain literal JSON braces.

What a client may have written (candidate texts, a tool's definition, a tool call's arguments) is passed
through the ``escape`` a method is given (the chat renderer's escaper) before it is placed in a template;
the format's own text never is. Without one (the lab, rendering its own libraries) nothing is escaped.
"""

from __future__ import annotations

import json
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ssr_server.core.actions import ALL_ACTIONS, TOOL_ACTIONS, ActionName, allowed_actions
from ssr_server.core.errors import LibraryError
from ssr_server.core.library import Candidate, Library
from ssr_server.core.protocol import Grammar

FORMATS_DIR = Path(__file__).resolve().parent
DEFAULT_FORMAT = "ssr"
Escape = Callable[[str], str]


def _verbatim(text: str) -> str:
    return text


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _System(_Strict):
    instructions: str
    body: str
    strategy: str
    order: Literal["id", "library"] = "library"


class _Reasoning(_Strict):
    open: str
    close: str
    candidate: str
    label: str


class _Pair(_Strict):
    open: str
    close: str


class _Chat(_Strict):
    open: str
    close: str


class _User(_Strict):
    text: str
    image: str


class _Actions(_Strict):
    tool_call: _Pair
    answer: _Pair


class _Observations(_Strict):
    image_search_header: str
    image_search_hit: str
    image_search_thumbnail: str
    image_search_empty: str
    text_search_hit: str
    text_search_separator: str
    text_search_empty: str
    zoom: str
    tool_error: str
    invalid_action: str


class _FormatFile(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$")
    description: str = ""
    system: _System
    reasoning: _Reasoning
    chat: _Chat
    user: _User
    placeholder: str
    vision_marker: str
    actions: _Actions
    tool_names: dict[str, str]
    tool_response: _Pair
    observations: _Observations
    escape: dict[str, str] = Field(default_factory=dict)
    tools: list[dict[str, Any]]
    client_tools: str  # {tools}: a client's own tool signatures (OpenAI route), one JSON line each


@dataclass(frozen=True)
class PromptFormat:
    name: str
    description: str
    instructions: string.Template
    body: string.Template
    strategy_line: str
    strategy_order: Literal["id", "library"]
    reasoning: _Reasoning
    chat: _Chat
    user: _User
    placeholder: str
    vision_marker: str
    actions: _Actions
    tool_names: Mapping[str, str]
    tool_response: _Pair
    observations: _Observations
    escapes: Mapping[str, str]
    tools: tuple[Mapping[str, Any], ...]
    client_tools: str

    # ---- the system prompt ---------------------------------------------------------------------
    def display_order(self, library: Library) -> list[int]:
        """Candidate indices in the order the system prompt lists them (also the labels' numbers)."""
        n = len(library.candidates)
        if self.strategy_order == "id":
            return sorted(range(n), key=lambda i: library.candidates[i].id)
        return list(range(n))

    def expected_actions(self, candidate: Candidate) -> str:
        names = [self.tool_names[a] if a in TOOL_ACTIONS else a for a in allowed_actions(candidate.action)]
        return ", ".join(names)

    def system_prompt(self, library: Library, escape: Escape = _verbatim) -> str:
        lines = [self.strategy_line.format(index=shown, text=escape(library.candidates[i].text),
                                           actions=self.expected_actions(library.candidates[i]))
                 for shown, i in enumerate(self.display_order(library))]
        tools = "\n".join(json.dumps(t, ensure_ascii=False) for t in self.tools)
        n = len(library.candidates)
        return (self.instructions.substitute(num_candidates=n, strategies="\n".join(lines))
                + self.body.substitute(tools=tools))

    # ---- reasoning -----------------------------------------------------------------------------
    def candidate_surfaces(self, library: Library, label_only: bool = False,
                           escape: Escape = _verbatim) -> tuple[str, ...]:
        """What is scored for each candidate (library order), and pasted verbatim when chosen."""
        if not label_only:
            return tuple(self.reasoning.candidate.format(text=escape(c.text)) for c in library.candidates)
        shown = {i: n for n, i in enumerate(self.display_order(library))}
        return tuple(self.reasoning.candidate.format(text=self.reasoning.label.format(index=shown[i]))
                     for i in range(len(library.candidates)))

    # ---- actions -------------------------------------------------------------------------------
    def action_opening(self, action: ActionName) -> str:
        """Text forced after the reasoning for ``action``: the model then decodes only the arguments
        (a JSON object) or the answer text."""
        if action == "answer":
            return self.actions.answer.open
        name = json.dumps(self.tool_names[action])
        return f'{self.actions.tool_call.open}{{"name": {name}, "arguments": '

    def action_closing(self, action: ActionName) -> str:
        """Text appended after a tool call's decoded arguments (the answer's grammar ends itself)."""
        return "" if action == "answer" else "}" + self.actions.tool_call.close

    def answer_grammar(self) -> Grammar:
        """A non-empty answer without tags, then the closing tag: no invalid answer can be decoded."""
        close = json.dumps(self.actions.answer.close)
        return Grammar("ebnf", rf"root ::= [^<\x00-\x20] [^<\x00-\x08\x0b-\x1f]* {close}")

    def tool_call_text(self, action: ActionName, arguments: Mapping[str, Any],
                       escape: Escape = _verbatim) -> str:
        """A whole tool call as the format writes it (history rendering, oracle trajectories)."""
        return (self.action_opening(action) + escape(json.dumps(dict(arguments), ensure_ascii=False))
                + self.action_closing(action))

    def tool_action(self, tool_name: str) -> ActionName | None:
        """The action of an advertised tool name (``None`` if the format does not know it)."""
        for action, name in self.tool_names.items():
            if name == tool_name and action in ALL_ACTIONS:
                return action  # type: ignore[return-value]
        return None

    # ---- chat pieces -------------------------------------------------------------------------
    def message(self, role: str, content: str) -> str:
        return self.chat.open.format(role=role) + content + self.chat.close

    def assistant_start(self) -> str:
        return self.chat.open.format(role="assistant")

    def image_placeholder(self, number: int) -> str:
        return self.placeholder.format(number=number)

    def user_content(self, question: str, first_number: int, n_images: int) -> str:
        images = "".join(self.user.image.format(placeholder=self.image_placeholder(first_number + i))
                         for i in range(n_images))
        return self.user.text.format(question=question, images=images)

    def client_tools_block(self, tools: Sequence[Mapping[str, Any]], escape: Escape = _verbatim) -> str:
        """The system-prompt section advertising a client's tools (``{"type": "function", ...}``
        entries), written as Qwen's chat template writes them (``tojson``: default separators). Each
        entry's JSON line is escaped whole: a marker cannot span JSON's quotes, so this neutralises what
        escaping every string would, and also a line that is an added token of its own."""
        lines = "".join("\n" + escape(json.dumps(dict(t), ensure_ascii=False)) for t in tools)
        return self.client_tools.format(tools=lines)

    def observation_turn(self, text: str) -> str:
        """Closes the assistant turn, carries an observation, opens the next assistant turn."""
        body = self.tool_response.open + text + self.tool_response.close
        return self.chat.close + self.message("user", body) + self.assistant_start()


def _read(folder: Path, name: str) -> str:
    try:
        return (folder / name).read_text(encoding="utf-8")
    except OSError as exc:
        raise LibraryError(f"{folder / name}: cannot read format text: {exc}") from None


def load_format(folder: str | Path) -> PromptFormat:
    """Load and validate a format folder; problems raise ``LibraryError`` naming the file."""
    folder = Path(folder)
    path = folder / "format.yaml"
    try:
        raw: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
        data = _FormatFile.model_validate(raw)
    except (OSError, yaml.YAMLError) as exc:
        raise LibraryError(f"{path}: cannot read format: {exc}") from None
    except ValidationError as exc:
        raise LibraryError(f"{path}: invalid format: {exc.errors(include_url=False)[:3]}") from None
    missing = set(TOOL_ACTIONS) - set(data.tool_names)
    if missing:
        raise LibraryError(f"{path}: tool_names lacks {sorted(missing)}")
    return PromptFormat(
        name=data.name, description=data.description.strip(),
        instructions=string.Template(_read(folder, data.system.instructions)),
        body=string.Template(_read(folder, data.system.body)),
        strategy_line=data.system.strategy, strategy_order=data.system.order, reasoning=data.reasoning,
        chat=data.chat, user=data.user, placeholder=data.placeholder, vision_marker=data.vision_marker,
        actions=data.actions, tool_names=dict(data.tool_names), tool_response=data.tool_response,
        observations=data.observations, escapes=dict(data.escape), tools=tuple(data.tools),
        client_tools=data.client_tools)


_CACHE: dict[str, PromptFormat] = {}


def get_format(name: str = DEFAULT_FORMAT, extra_dirs: Sequence[str | Path] = ()) -> PromptFormat:
    """A shipped format by name (folders under ``ssr_server/core/formats``), or one in ``extra_dirs``."""
    for root in (*[Path(d) for d in extra_dirs], FORMATS_DIR):
        folder = root / name
        if (folder / "format.yaml").is_file():
            key = str(folder.resolve())
            if key not in _CACHE:
                _CACHE[key] = load_format(folder)
            return _CACHE[key]
    raise LibraryError(f"unknown prompt format {name!r}")

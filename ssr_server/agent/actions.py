"""One grammar per action type: its opening tag (forced after selection), closing tag (the stop
string) and a parser that turns the decoded argument into a tool call or an answer.

Forcing the opening of the chosen candidate's action makes the decoded action's type match the
rationale by construction; only the argument is left to the model, and a bad argument becomes an
observation (``ActionParseError``) that counts toward the run's error limit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ssr_server.errors import ActionParseError
from ssr_server.tools.base import ToolCall

MAX_QUERY_CHARS = 300
MAX_ANSWER_CHARS = 2000


@dataclass(frozen=True)
class ParsedAction:
    type: str  # image_search | text_search | zoom | answer
    argument: str
    call: ToolCall | None = None  # None for an answer


@dataclass(frozen=True)
class ActionGrammar:
    type: str
    max_new_tokens: int  # 0: the action takes no argument and is forced whole, nothing is decoded

    @property
    def opening(self) -> str:
        return f"<{self.type}>"

    @property
    def closing(self) -> str:
        return f"</{self.type}>"

    def parse(self, argument: str) -> ParsedAction:
        arg = argument.strip()
        if self.type == "answer":
            if not arg:
                raise ActionParseError("the answer is empty")
            return ParsedAction("answer", arg[:MAX_ANSWER_CHARS])
        if self.type == "text_search":
            if not arg:
                raise ActionParseError("the text_search query is empty")
            if len(arg) > MAX_QUERY_CHARS:
                raise ActionParseError(f"the text_search query is longer than {MAX_QUERY_CHARS} characters")
            return ParsedAction("text_search", arg, ToolCall("text_search", query=arg))
        if self.type == "image_search":
            # Empty means the latest image; a number picks an image (1-based, in context order).
            if not arg:
                return ParsedAction("image_search", arg, ToolCall("image_search"))
            if re.fullmatch(r"\d{1,2}", arg):
                return ParsedAction("image_search", arg, ToolCall("image_search", image_index=int(arg) - 1))
            raise ActionParseError("image_search takes no argument, or an image number such as 1")
        if self.type == "zoom":
            return ParsedAction("zoom", arg, ToolCall("zoom", box=parse_box(arg)))
        raise ActionParseError(f"unknown action type {self.type!r}")


def parse_box(text: str) -> tuple[int, int, int, int]:
    m = re.fullmatch(r"\[\s*(-?\d+(?:\.\d+)?)\s*,\s*(-?\d+(?:\.\d+)?)\s*,\s*(-?\d+(?:\.\d+)?)\s*,"
                     r"\s*(-?\d+(?:\.\d+)?)\s*\]", text.strip())
    if m is None:
        raise ActionParseError("zoom expects a box [x1, y1, x2, y2] in 0-1000 relative coordinates, "
                               f"got {text.strip()[:60]!r}")
    x1, y1, x2, y2 = (round(float(v)) for v in m.groups())
    if not all(0 <= v <= 1000 for v in (x1, y1, x2, y2)):
        raise ActionParseError("zoom box coordinates must lie in 0-1000")
    if x1 >= x2 or y1 >= y2:
        raise ActionParseError("zoom box needs x1 < x2 and y1 < y2")
    return x1, y1, x2, y2


GRAMMARS: dict[str, ActionGrammar] = {
    g.type: g for g in (
        ActionGrammar("image_search", 0),  # searches the latest image: nothing to decode
        ActionGrammar("text_search", 40),
        ActionGrammar("zoom", 24),
        ActionGrammar("answer", 64),
    )
}
TOOL_TYPES: tuple[str, ...] = ("image_search", "text_search", "zoom")
ALL_TYPES: tuple[str, ...] = (*TOOL_TYPES, "answer")


def allowed_types(candidate_action: str) -> tuple[str, ...]:
    """Action types a candidate allows: itself, or a choice for the ``tool`` / ``any`` ablations."""
    if candidate_action == "tool":
        return TOOL_TYPES
    if candidate_action == "any":
        return ALL_TYPES
    return (candidate_action,)

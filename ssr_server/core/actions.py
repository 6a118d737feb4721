"""The action table: the four concrete actions, what each one decodes and how it is checked.

One row per action: whether it calls a tool, the JSON schema its arguments are decoded under (the
engine decodes under that grammar, so every call parses and validates by construction), its decoding
budget, and the checks no schema can express (zoom corners strictly increasing). How an action is
*written* (tags, tool names, the answer's grammar) belongs to the prompt format
(``ssr_server.core.formats``); what it *means* is here, with ``ToolCall`` (a parsed call) and
``validate_box`` (the zoom box's check, shared with the zoom tool). A rationale's ``action`` is one of
these names or a meta action: ``tool`` (any of the three tools, the model decodes which) or ``any`` (any
tool or the answer). Zoom and image search work on an image: in a context without one they cannot run,
so ``possible_actions`` leaves them out and their grammar is never built there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from ssr_server.core.errors import ActionParseError, ToolError
from ssr_server.core.limits import BOX_SCALE, MAX_LABEL_CHARS, MAX_QUERY_CHARS


@dataclass(frozen=True)
class ToolCall:
    """A parsed action: the tool name and its arguments."""

    tool: str  # "image_search" | "text_search" | "zoom"
    query: str = ""
    box: tuple[int, int, int, int] | None = None  # 0-1000 relative coordinates
    image_index: int = 0  # which image of the registry the call refers to (0-based)
    label: str = ""  # what the zoom box holds (for the trace)


def validate_box(box: Sequence[float] | Any, min_side: int = 20) -> tuple[int, int, int, int]:
    """Check a 0-1000 box and return it as ints; errors are phrased for the model to fix its call.

    ``min_side`` (in 0-1000 units) refuses slivers: a 2% wide crop of a small image upscales to mush.
    """
    if not isinstance(box, list | tuple):
        raise ToolError("zoom needs a box [x1, y1, x2, y2] in 0-1000 coordinates")
    if len(box) != 4:
        raise ToolError(f"a box has 4 numbers [x1, y1, x2, y2], got {len(box)}")
    if any(isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) for v in box):
        raise ToolError("box coordinates must be four finite numbers")
    x1, y1, x2, y2 = (round(v) for v in box)
    if min(x1, y1, x2, y2) < 0 or max(x1, y1, x2, y2) > BOX_SCALE:
        raise ToolError(f"box [{x1}, {y1}, {x2}, {y2}] is outside the 0-{BOX_SCALE} range")
    if x1 >= x2 or y1 >= y2:
        raise ToolError(f"box [{x1}, {y1}, {x2}, {y2}] is empty: it needs x1 < x2 and y1 < y2")
    if x2 - x1 < min_side or y2 - y1 < min_side:
        raise ToolError(f"box [{x1}, {y1}, {x2}, {y2}] is too small: each side must be at least {min_side}")
    return x1, y1, x2, y2


ActionName = Literal["image_search", "text_search", "zoom", "answer"]
MetaAction = Literal["tool", "any"]
RationaleAction = Literal["image_search", "text_search", "zoom", "answer", "tool", "any"]

TOOL_ACTIONS: tuple[ActionName, ...] = ("image_search", "text_search", "zoom")
ALL_ACTIONS: tuple[ActionName, ...] = (*TOOL_ACTIONS, "answer")
RATIONALE_ACTIONS: frozenset[str] = frozenset(get_args(RationaleAction))


def _text_pattern(max_chars: int) -> str:
    # Printable ASCII without '<' (no tag or special-token text can be written), backslash or quote (the
    # JSON string holds no escapes, so what the grammar admits is exactly what strict json.loads
    # accepts), not starting with a space. ASCII because xgrammar 0.2.9 let invalid UTF-8 through wider
    # classes: random-logit sampling under [^<\\"\x00-\x1f] gave 7 of 60 strings with broken bytes, explicit
    # BMP ranges 3 of 60, printable ASCII 0 of 60 (tests/core/test_actions.py samples the same way).
    return rf"^[!#-;=-\[\]-~][ !#-;=-\[\]-~]{{0,{max_chars - 1}}}$"


@dataclass(frozen=True)
class ActionSpec:
    name: ActionName
    max_new_tokens: int  # enough for the longest text the schema admits, one token per character
    needs_image: bool = False  # zoom and image search: impossible in a context without an image

    @property
    def is_tool(self) -> bool:
        return self.name != "answer"

    def can_run(self, n_images: int) -> bool:
        return n_images > 0 or not self.needs_image

    def arguments_schema(self, n_images: int) -> dict[str, Any]:
        """The JSON schema of the call's ``arguments`` object in a context holding ``n_images``."""
        if not self.can_run(n_images):
            # No schema can be satisfied by a call that cannot run (zoom's img_idx would have no value).
            raise ValueError(f"{self.name} needs an image; the context has none")
        if self.name == "image_search":
            return {"type": "object", "properties": {}, "additionalProperties": False}
        if self.name == "text_search":
            return {"type": "object", "additionalProperties": False, "required": ["query"],
                    "properties": {"query": {"type": "string", "pattern": _text_pattern(MAX_QUERY_CHARS)}}}
        if self.name == "zoom":
            coord = {"type": "integer", "minimum": 0, "maximum": BOX_SCALE}
            return {"type": "object", "additionalProperties": False,
                    "required": ["bbox_2d", "label", "img_idx"],
                    "properties": {
                        "bbox_2d": {"type": "array", "items": coord, "minItems": 4, "maxItems": 4},
                        "label": {"type": "string", "pattern": _text_pattern(MAX_LABEL_CHARS)},
                        "img_idx": {"type": "integer", "minimum": 0, "maximum": max(0, n_images - 1)},
                    }}
        raise ValueError("the answer takes no arguments object")

    def to_call(self, arguments: Mapping[str, Any], n_images: int) -> ToolCall:
        """A checked tool call from decoded arguments; ``ActionParseError`` says what is wrong."""
        if not self.can_run(n_images):
            raise ActionParseError(f"{self.name} needs an image and there is none")
        if self.name == "image_search":
            if arguments:
                raise ActionParseError("image_search_tool takes no arguments")
            return ToolCall("image_search", image_index=0)  # the question's image, like the reference
        if self.name == "text_search":
            query = arguments.get("query")
            if not isinstance(query, str) or not query.strip() or len(query) > MAX_QUERY_CHARS:
                raise ActionParseError(f"text_search needs a query of 1 to {MAX_QUERY_CHARS} characters")
            return ToolCall("text_search", query=" ".join(query.split()))
        if self.name == "zoom":
            return ToolCall("zoom", box=_box(arguments.get("bbox_2d")), label=_label(arguments.get("label")),
                            image_index=_image_index(arguments.get("img_idx"), n_images))
        raise ActionParseError("an answer is not a tool call")


def _box(value: Any) -> tuple[int, int, int, int]:
    try:  # the zoom tool's own check, minus its least side (the tool refuses slivers when it runs)
        return validate_box(value, min_side=0)
    except ToolError as e:
        raise ActionParseError(f"bbox_2d: {e}") from None


def _label(value: Any) -> str:
    if not isinstance(value, str) or len(value) > MAX_LABEL_CHARS:
        raise ActionParseError(f"label must be a string of at most {MAX_LABEL_CHARS} characters")
    return value.strip()


def _image_index(value: Any, n_images: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or int(value) != value:
        raise ActionParseError("img_idx must be an integer")
    if not 0 <= int(value) < n_images:
        available = "there is no image" if n_images < 1 else (
            "image 0 is the only one" if n_images == 1 else f"images 0 to {n_images - 1} are available")
        raise ActionParseError(f"img_idx {int(value)} does not exist; {available}")
    return int(value)


ACTIONS: dict[str, ActionSpec] = {
    "image_search": ActionSpec("image_search", max_new_tokens=8, needs_image=True),
    "text_search": ActionSpec("text_search", max_new_tokens=MAX_QUERY_CHARS + 16),
    "zoom": ActionSpec("zoom", max_new_tokens=MAX_LABEL_CHARS + 48, needs_image=True),
    "answer": ActionSpec("answer", max_new_tokens=96),
}


def allowed_actions(rationale_action: str) -> tuple[ActionName, ...]:
    """The concrete actions a rationale allows: itself, the tools (``tool``) or all four (``any``)."""
    if rationale_action == "tool":
        return TOOL_ACTIONS
    if rationale_action == "any":
        return ALL_ACTIONS
    if rationale_action in ACTIONS:
        return (ACTIONS[rationale_action].name,)
    raise ValueError(f"unknown rationale action {rationale_action!r}")


def possible_actions(rationale_action: str, n_images: int) -> tuple[ActionName, ...]:
    """The actions a rationale allows that can run in a context holding ``n_images``: without an image,
    zoom and image search are left out (a ``tool`` rationale keeps text search, ``any`` text search and
    the answer, a ``zoom`` or ``image_search`` rationale keeps nothing)."""
    return tuple(a for a in allowed_actions(rationale_action) if ACTIONS[a].can_run(n_images))

"""The tool protocol: async, bounded by a timeout, failures become observations."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from ssr_server.engine.base import ImageRef


@dataclass(frozen=True)
class Observation:
    """What a tool gives back to the model: text, and optionally new images (a zoomed crop)."""

    text: str
    images: tuple[ImageRef, ...] = ()
    ok: bool = True
    data: dict[str, object] = field(default_factory=dict)  # structured hits for traces / API


@dataclass(frozen=True)
class ToolCall:
    """A parsed action: the tool name and its argument (query text, or box for zoom)."""

    tool: str  # "image_search" | "text_search" | "zoom"
    query: str = ""
    box: tuple[int, int, int, int] | None = None  # 0-1000 relative coordinates
    image_index: int = -1  # which context image the call refers to (-1: latest)


@dataclass(frozen=True)
class ToolContext:
    """What a tool may read from the run: the images seen so far (originals then crops)."""

    images: tuple[ImageRef, ...]


class Tool(Protocol):
    name: str

    async def __call__(self, call: ToolCall, ctx: ToolContext) -> Observation: ...

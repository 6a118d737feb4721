"""The tool protocol: async, bounded by a timeout, failures become observations.

Tools return structured results (hits, new images, or an error); the prompt format writes them as text
for the model (``ssr_server.agent.observe``), so the words the model reads are data of the format, not
of each tool.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from ssr_server.core.actions import ToolCall
from ssr_server.core.protocol import ImageRef


@dataclass(frozen=True)
class SearchHit:
    """One search result: ``text`` is the snippet (text search) or the description (image search);
    ``thumbnail`` an image of the hit (image search), which enters the context."""

    title: str
    url: str
    text: str = ""
    score: float = 0.0
    thumbnail: ImageRef | None = None


@dataclass(frozen=True)
class Observation:
    """What a tool gives back: search hits, new images (a zoomed crop; thumbnails, which are also
    ``hits[i].thumbnail`` in hit order), or a failure with a reason the model can read."""

    ok: bool = True
    hits: tuple[SearchHit, ...] = ()
    images: tuple[ImageRef, ...] = ()
    error: str | None = None
    data: dict[str, object] = field(default_factory=dict)  # structured details for traces and the API


@dataclass(frozen=True)
class ToolContext:
    """What a tool may read from the run: the image registry so far (inputs, thumbnails, crops)."""

    images: tuple[ImageRef, ...]


class Tool(Protocol):
    name: str

    async def __call__(self, call: ToolCall, ctx: ToolContext) -> Observation: ...

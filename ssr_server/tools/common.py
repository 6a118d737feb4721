"""Helpers the tools share: picking the image a call refers to, closing backends, HTTP errors."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import httpx

from ssr_server.core.errors import ToolError
from ssr_server.core.protocol import ImageRef
from ssr_server.tools.base import ToolContext


@runtime_checkable
class SupportsAclose(Protocol):
    """Backends holding connections expose ``aclose``; the registry closes them at shutdown."""

    async def aclose(self) -> None: ...


def pick_image(ctx: ToolContext, index: int) -> tuple[int, ImageRef]:
    """The image a call refers to (0-based over the run's image registry; negative counts from the end)
    and its position; an out-of-range index is the model's mistake and becomes a ToolError it can read.
    """
    n = len(ctx.images)
    if n == 0:
        raise ToolError("there is no image to work on")
    if not -n <= index < n:
        raise ToolError(f"image index {index} does not exist; indices 0 to {n - 1} are available")
    pos = index % n
    return pos, ctx.images[pos]


def http_error(service: str, exc: httpx.HTTPError, timeout_s: float) -> ToolError:
    """A model-readable ToolError for a transport failure, without leaking stack traces."""
    if isinstance(exc, httpx.TimeoutException):
        return ToolError(f"{service} did not answer within {timeout_s:g} s")
    return ToolError(f"{service} is unreachable ({type(exc).__name__})")


def check_status(service: str, response: httpx.Response) -> None:
    if response.status_code != 200:
        raise ToolError(f"{service} returned HTTP {response.status_code}")


def clip(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` (with an ellipsis), so one long page cannot flood the context."""
    text = " ".join(text.split())
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


class BackendTool:
    """What the search tools share: a backend, how many hits to show, how much text per hit at most."""

    def __init__(self, backend: object, *, k: int, max_chars: int) -> None:
        if k <= 0 or max_chars < 100:
            raise ValueError("need k > 0 and max_chars >= 100")
        self.backend = backend
        self.k = k
        self.max_chars = max_chars

    async def aclose(self) -> None:
        close = getattr(self.backend, "aclose", None)
        if close is not None:
            await close()

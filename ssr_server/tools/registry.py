"""The tool registry: the one place where tool calls are bounded in time and failures become observations.

The agent loop never sees a tool exception: a bad box, a search backend down, a timeout or a bug all
come back as ``Observation(ok=False, error="...")``, which the prompt format writes for the model to
read and react to, so one broken tool degrades a run instead of failing the HTTP request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Iterable

from ssr_server.core import metrics
from ssr_server.core.actions import ToolCall
from ssr_server.core.errors import ToolError
from ssr_server.tools.base import Observation, Tool, ToolContext
from ssr_server.tools.common import SupportsAclose
from ssr_server.tools.demo import shipped_demo_world
from ssr_server.tools.image_search import (
    HTTPImageSearchBackend,
    ImageSearchBackend,
    ImageSearchTool,
    LocalImageIndex,
)
from ssr_server.tools.text_search import LocalBM25, SearxNGBackend, TextSearchBackend, TextSearchTool
from ssr_server.tools.zoom import ZoomTool

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 20.0
_MAX_ERROR_CHARS = 300


def _failure(name: str, reason: str, code: str, elapsed_s: float) -> Observation:
    return Observation(ok=False, error=reason[:_MAX_ERROR_CHARS],
                       data={"error": code, "tool": name, "elapsed_s": round(elapsed_s, 6)})


class ToolRegistry:
    """Tools by name, and ``run`` which never raises (except on cancellation of the caller)."""

    def __init__(self, tools: Iterable[Tool] = (), *, default_timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.default_timeout_s = default_timeout_s
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"a tool named {tool.name!r} is already registered")
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    async def run(self, call: ToolCall, ctx: ToolContext, timeout_s: float | None = None) -> Observation:
        """Run one call under a timeout; every failure, of any kind, becomes a failed Observation."""
        name = call.tool
        tool = self._tools.get(name)
        if tool is None:
            available = ", ".join(self._tools) or "none"
            return _failure(name, f"unknown tool; available tools: {available}", "unknown_tool", 0.0)
        limit = self.default_timeout_s if timeout_s is None else timeout_s
        start = time.perf_counter()
        try:
            async with asyncio.timeout(limit) as scope:
                obs = await tool(call, ctx)
            if not isinstance(obs, Observation):
                raise TypeError(f"tool returned {type(obs).__name__}, not an Observation")
        except ToolError as e:
            obs = _failure(name, e.message, e.code, time.perf_counter() - start)
        except TimeoutError:
            elapsed = time.perf_counter() - start
            if scope.expired():
                obs = _failure(name, f"timed out after {limit:g} s", "timeout", elapsed)
            else:  # the tool's own timeout (e.g. a socket), not ours
                obs = _failure(name, "an operation inside the tool timed out", "timeout", elapsed)
        except Exception as e:
            log.exception("tool %s raised unexpectedly", name)
            obs = _failure(name, f"internal error ({type(e).__name__})", "internal_error",
                           time.perf_counter() - start)
        else:
            elapsed = round(time.perf_counter() - start, 6)
            obs = dataclasses.replace(obs, data={**obs.data, "elapsed_s": elapsed})
        metrics.TOOL_SECONDS.labels(tool=name).observe(time.perf_counter() - start)
        return obs

    async def aclose(self) -> None:
        """Close tools that hold connections (HTTP backends); errors are logged, not raised."""
        for tool in self._tools.values():
            if isinstance(tool, SupportsAclose):
                try:
                    await tool.aclose()
                except Exception:
                    log.exception("closing tool %s failed", tool.name)


def demo_registry(*, default_timeout_s: float = DEFAULT_TIMEOUT_S) -> ToolRegistry:
    """Zoom, BM25 text search and image search over the demo world shipped in the package."""
    world = shipped_demo_world()
    return build_registry(corpus_path=world.corpus_path, image_index_dir=world.image_dir,
                          default_timeout_s=default_timeout_s)


def build_registry(
    *,
    searxng_url: str | None = None,
    image_search_url: str | None = None,
    corpus_path: str | os.PathLike[str] | None = None,
    image_index_dir: str | os.PathLike[str] | None = None,
    http_timeout_s: float = 10.0,
    default_timeout_s: float = DEFAULT_TIMEOUT_S,
    text_k: int = 5,
    image_k: int = 3,
) -> ToolRegistry:
    """The registry from plain settings: a URL wins over the local source for the same tool.

    Zoom is always present. A search tool with neither a URL nor a local source is left out, so
    ``registry.names`` is what the agent may be told it can call.
    """
    tools: list[Tool] = [ZoomTool()]
    text: TextSearchBackend | None = None
    if searxng_url:
        text = SearxNGBackend(searxng_url, timeout_s=http_timeout_s)
    elif corpus_path is not None:
        text = LocalBM25.from_jsonl(corpus_path)
    if text is not None:
        tools.append(TextSearchTool(text, k=text_k))
    image: ImageSearchBackend | None = None
    if image_search_url:
        image = HTTPImageSearchBackend(image_search_url, timeout_s=http_timeout_s)
    elif image_index_dir is not None:
        image = LocalImageIndex(image_index_dir)
    if image is not None:
        tools.append(ImageSearchTool(image, k=image_k))
    return ToolRegistry(tools, default_timeout_s=default_timeout_s)

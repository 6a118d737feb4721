from __future__ import annotations

import asyncio

import pytest

from ssr_server.core import metrics
from ssr_server.core.actions import ToolCall
from ssr_server.core.errors import ToolError
from ssr_server.core.protocol import ImageRef
from ssr_server.tools.base import Observation, ToolContext
from ssr_server.tools.demo import DemoWorld, demo_picture, shipped_demo_world, showcase_question
from ssr_server.tools.image_search import HTTPImageSearchBackend, ImageSearchTool, LocalImageIndex
from ssr_server.tools.registry import ToolRegistry, build_registry, demo_registry
from ssr_server.tools.text_search import LocalBM25, SearxNGBackend, TextSearchTool
from ssr_server.tools.zoom import ZoomTool

EMPTY = ToolContext(images=())


class SleepyTool:
    name = "sleepy"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    async def __call__(self, call: ToolCall, ctx: ToolContext) -> Observation:
        await asyncio.sleep(self.seconds)
        return Observation(data={"woke": "up"})


class FailingTool:
    def __init__(self, name: str, exc: Exception) -> None:
        self.name = name
        self.exc = exc

    async def __call__(self, call: ToolCall, ctx: ToolContext) -> Observation:
        raise self.exc


class WrongTypeTool:
    name = "wrong"

    async def __call__(self, call: ToolCall, ctx: ToolContext) -> Observation:
        return "plain text"  # type: ignore[return-value]


def _koala_ctx() -> ToolContext:
    return ToolContext(images=(ImageRef.from_pil(demo_picture("k-koala")),))


async def test_success_passes_through_with_elapsed_time() -> None:
    reg = ToolRegistry([ZoomTool(), SleepyTool(0.0)])
    obs = await reg.run(ToolCall("zoom", box=(0, 0, 500, 500)), _koala_ctx())
    assert obs.ok and len(obs.images) == 1
    assert obs.data["size"] == [314, 224] and isinstance(obs.data["elapsed_s"], float)
    assert (await reg.run(ToolCall("sleepy"), EMPTY)).data["woke"] == "up"


async def test_tool_error_becomes_observation() -> None:
    obs = await ToolRegistry([ZoomTool()]).run(ToolCall("zoom", box=(10, 10, 5, 500)), _koala_ctx())
    assert not obs.ok
    assert obs.error is not None and obs.error.startswith("box [10, 10, 5, 500] is empty")
    assert obs.data["error"] == "tool_error" and obs.images == ()


async def test_timeout_becomes_observation_quickly() -> None:
    reg = ToolRegistry([SleepyTool(5.0)])
    obs = await reg.run(ToolCall("sleepy"), EMPTY, timeout_s=0.05)  # the tool would sleep 5 s
    assert not obs.ok and obs.error == "timed out after 0.05 s"
    assert obs.data["error"] == "timeout"
    slow_default = ToolRegistry([SleepyTool(5.0)], default_timeout_s=0.05)
    assert (await slow_default.run(ToolCall("sleepy"), EMPTY)).error == "timed out after 0.05 s"


async def test_unexpected_exceptions_become_observations() -> None:
    reg = ToolRegistry([
        FailingTool("boom", RuntimeError("kaput")),
        FailingTool("inner_timeout", TimeoutError()),
        WrongTypeTool(),
    ])
    boom = await reg.run(ToolCall("boom"), EMPTY)
    # the exception's type only: its message may hold internals (paths, addresses, credentials)
    assert not boom.ok and boom.error == "internal error (RuntimeError)"
    inner = await reg.run(ToolCall("inner_timeout"), EMPTY)
    assert not inner.ok and "timed out" in (inner.error or "") and inner.data["error"] == "timeout"
    wrong = await reg.run(ToolCall("wrong"), EMPTY)
    assert not wrong.ok and wrong.error == "internal error (TypeError)"


async def test_long_error_messages_are_cut() -> None:
    obs = await ToolRegistry([FailingTool("long", ToolError("x" * 5000))]).run(ToolCall("long"), EMPTY)
    assert obs.error is not None and len(obs.error) <= 300


async def test_unknown_tool_and_duplicates() -> None:
    reg = ToolRegistry([ZoomTool()])
    obs = await reg.run(ToolCall("web_browse"), EMPTY)
    assert not obs.ok and obs.error == "unknown tool; available tools: zoom"
    with pytest.raises(ValueError, match="already registered"):
        reg.register(ZoomTool())
    assert "zoom" in reg and "web_browse" not in reg and len(reg) == 1 and reg.get("nope") is None


async def test_caller_cancellation_is_not_swallowed() -> None:
    started = asyncio.Event()

    class Gate(SleepyTool):
        async def __call__(self, call: ToolCall, ctx: ToolContext) -> Observation:
            started.set()
            return await super().__call__(call, ctx)

    reg = ToolRegistry([Gate(5.0)])
    task = asyncio.create_task(reg.run(ToolCall("sleepy"), EMPTY, timeout_s=10))
    await asyncio.wait_for(started.wait(), 30)  # cancelled while the tool runs, not before
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_metrics_record_tool_latency() -> None:
    def count() -> float:
        return metrics.REGISTRY.get_sample_value("ssr_tool_seconds_count", {"tool": "sleepy"}) or 0.0

    before = count()
    await ToolRegistry([SleepyTool(0.0)]).run(ToolCall("sleepy"), EMPTY)
    await ToolRegistry([SleepyTool(1.0)]).run(ToolCall("sleepy"), EMPTY, timeout_s=0.01)
    assert count() == before + 2


async def test_http_failures_become_observations(live_server: str) -> None:
    reg = build_registry(searxng_url=f"{live_server}/broken", image_search_url=f"{live_server}/badjson")
    try:
        text = await reg.run(ToolCall("text_search", query="eiffel"), EMPTY)
        image = await reg.run(ToolCall("image_search"), _koala_ctx())
    finally:
        await reg.aclose()
    assert not text.ok and text.error == "SearxNG returned HTTP 500"
    assert not image.ok and "not JSON" in (image.error or "")


async def test_demo_registry_answers_the_showcase_question() -> None:
    """The demo world's headline question, move by move through the registry the server uses."""
    reg = demo_registry()
    assert reg.names == ("zoom", "text_search", "image_search")
    world = shipped_demo_world()
    q = showcase_question(world.questions())
    ctx = ToolContext(images=(ImageRef.from_pil(world.question_image(q)),))
    identify, lookup, _ = q.moves
    seen = await reg.run(ToolCall("image_search"), ctx)
    assert seen.ok and seen.hits[0].title == identify["expect_title"] == q.entity  # a view, not a copy
    fact = await reg.run(ToolCall("text_search", query=lookup["query"]), ctx)
    assert fact.ok and any(q.answer in h.text for h in fact.hits)
    crop = await reg.run(ToolCall("zoom", box=(250, 0, 750, 1000)), ctx)
    assert crop.ok and len(crop.images) == 1 and crop.data["image"] == 1
    await reg.aclose()


async def test_build_registry_picks_backends(demo_assets: DemoWorld, live_server: str) -> None:
    local = build_registry(corpus_path=demo_assets.corpus_path, image_index_dir=demo_assets.image_dir)
    text, image = local.get("text_search"), local.get("image_search")
    assert isinstance(text, TextSearchTool) and isinstance(text.backend, LocalBM25)
    assert isinstance(image, ImageSearchTool) and isinstance(image.backend, LocalImageIndex)

    remote = build_registry(
        searxng_url=f"{live_server}/searx", image_search_url=f"{live_server}/images",
        corpus_path=demo_assets.corpus_path, image_index_dir=demo_assets.image_dir, http_timeout_s=3,
    )
    text, image = remote.get("text_search"), remote.get("image_search")
    assert isinstance(text, TextSearchTool) and isinstance(text.backend, SearxNGBackend)
    assert isinstance(image, ImageSearchTool) and isinstance(image.backend, HTTPImageSearchBackend)
    obs = await remote.run(ToolCall("text_search", query="Koala diet"), EMPTY)
    assert obs.ok and obs.hits and all(h.title for h in obs.hits)
    client = text.backend._client
    assert client is not None and not client.is_closed
    await remote.aclose()
    assert client.is_closed

    bare = build_registry()
    assert bare.names == ("zoom",)
    assert not (await bare.run(ToolCall("text_search", query="x"), EMPTY)).ok

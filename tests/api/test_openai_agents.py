"""A real agent framework (the OpenAI Agents SDK, from the package index) runs its own tool loop against
the server, unchanged but for ``base_url``: its tools wrap the demo world's search backends, the server
selects the reasoning and decodes the calls, and the loop goes from the tool calls to a final answer.
(Whether that answer is right is the model's business: the shipped model's success is measured by
``ssr-lab eval``, not here.)"""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import Iterator
from typing import Any

import pytest

from ssr_server.agent.escape import Escaper
from ssr_server.agent.observe import observation_text
from ssr_server.core.actions import ToolCall
from ssr_server.core.config import Settings
from ssr_server.core.formats.format import get_format
from ssr_server.core.protocol import ImageRef
from ssr_server.tools.base import ToolContext
from ssr_server.tools.demo import shipped_demo_world, showcase_question
from ssr_server.tools.registry import ToolRegistry, demo_registry


@pytest.fixture(scope="module")
def trained_server() -> Iterator[tuple[str, ToolRegistry]]:
    """The shipped default model (what ``serve`` loads without ``--model``) behind a real server."""
    from ssr_server.bench.serve import live_server
    from ssr_server.engine.factory import resolve_model
    from ssr_server.engine.torch.engine import TorchEngine

    tools = demo_registry()
    engine = TorchEngine(resolve_model(Settings()))
    try:
        with live_server(Settings(), engine, tools) as url:
            yield url, tools
    finally:
        asyncio.run(engine.close())


Served = tuple[str, ToolRegistry]


def test_openai_agents_sdk_tool_loop_reaches_the_answer(trained_server: Served) -> None:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    url, registry = trained_server
    set_tracing_disabled(True)  # the SDK would otherwise export traces to OpenAI
    world = shipped_demo_world()
    question = showcase_question(world.questions())
    picture = world.question_image(question)
    fmt = get_format()
    escape = Escaper((), fmt.escapes)  # the server escapes the tool message again, with its tokens
    calls: list[tuple[str, dict[str, Any]]] = []

    async def run_tool(tool: str, arguments: dict[str, Any]) -> str:
        # The application's tools: our demo world's backends, rendered as the format's observation text.
        calls.append((tool, arguments))
        obs = await registry.run(ToolCall(tool, arguments), ToolContext([ImageRef.from_pil(picture)]))
        return observation_text(fmt, escape, tool, obs, 1)

    @function_tool
    async def image_search_tool() -> str:
        """Perform a reverse image search to find similar images and related information."""
        return await run_tool("image_search", {"image_index": 0})

    @function_tool
    async def text_search_tool(query: str) -> str:
        """Search the web for text information related to your query."""
        return await run_tool("text_search", {"query": query})

    buf = io.BytesIO()
    picture.save(buf, format="PNG")
    image_url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()

    async def main() -> Any:
        async with AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as client:
            model_id = (await client.models.list()).data[0].id
            agent = Agent(name="searcher", tools=[image_search_tool, text_search_tool],
                          model=OpenAIChatCompletionsModel(model=model_id, openai_client=client),
                          # the first turn must call a tool (the SDK then resets the choice to auto)
                          model_settings=ModelSettings(temperature=0.0, tool_choice="required"))
            user = {"role": "user", "content": [{"type": "input_text", "text": question.question},
                                                {"type": "input_image", "image_url": image_url,
                                                 "detail": "auto"}]}
            return await Runner.run(agent, [user], max_turns=8)  # type: ignore[list-item]

    result = asyncio.run(main())
    assert calls and calls[0][0] in ("image_search", "text_search"), calls
    for tool, arguments in calls:  # the SDK ran our tools with arguments its own schemas accept
        assert (tool == "image_search" and arguments == {"image_index": 0}) or (
            tool == "text_search" and isinstance(arguments["query"], str) and arguments["query"]), calls
    answer = str(result.final_output)
    assert answer.strip() and "<tool_call>" not in answer and "<thinking>" not in answer, answer
    # one model response per tool call (one call a turn), then the answer
    assert len(result.raw_responses) == len(calls) + 1


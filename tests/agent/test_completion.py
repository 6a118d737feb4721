"""One assistant turn on a client's conversation (the OpenAI route's core): rendering, move mapping,
tool_choice, reasoning memory."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from ssr_server.agent.chat import Message
from ssr_server.agent.completion import (
    ANSWER,
    ClientTool,
    Completer,
    CompletionOptions,
    ReasoningMemory,
    ToolChoice,
)
from ssr_server.agent.loop import Agent
from ssr_server.core.errors import InvalidRequest
from ssr_server.core.library import Library
from ssr_server.core.protocol import ImageRef


def ours(agent: Agent) -> list[ClientTool]:
    return [ClientTool(t["function"]["name"], t["function"]["description"], t["function"]["parameters"])
            for t in agent.format.tools]


def test_our_tools_render_exactly_like_the_agent_question(agent: Agent, demo_image: ImageRef) -> None:
    """An SSR checkpoint sees the same tokens through the OpenAI route as through the agent loop."""
    library = agent.libraries.get("default")
    completer = Completer(agent)
    via_chat = completer.render([Message("user", ("How tall is it?", demo_image))], ours(agent), library)
    assert via_chat == agent.start("How tall is it?", [demo_image], library)


def test_other_tools_get_qwen_tool_section_after_the_client_system_text(agent: Agent) -> None:
    tool = ClientTool("get_weather", "Weather", {"type": "object", "properties": {}})
    ctx = Completer(agent).render([Message("system", ("Be brief.",)), Message("user", ("Rain?",))], [tool],
                                  agent.libraries.get("default"))
    text = agent.engine.tokenizer.decode(list(ctx.token_ids), skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert '\n{"type": "function", "function": {"name": "get_weather", "description": "Weather", ' in text
    assert agent.format.system_prompt(agent.libraries.get("default")) not in text


@pytest.mark.parametrize(("choice", "expected"), [
    (ToolChoice("auto"), {"r_IDENTIFY_BY_IMAGE": ["image_search_tool"], "r_LOOKUP_FACT": ["text_search_tool"],
                          "r_ANSWER_FROM_IMAGE": [ANSWER], "r_ZOOM_DETAIL": []}),
    (ToolChoice("required"), {"r_IDENTIFY_BY_IMAGE": ["image_search_tool"], "r_ANSWER_FROM_IMAGE": []}),
    (ToolChoice("none"), {"r_IDENTIFY_BY_IMAGE": [], "r_GENERAL_KNOW": [ANSWER]}),
    (ToolChoice("function", "text_search_tool"), {"r_LOOKUP_FACT": ["text_search_tool"],
                                                   "r_IDENTIFY_BY_IMAGE": []}),
])
def test_candidates_map_onto_the_requested_moves(agent: Agent, choice: ToolChoice,
                                                 expected: dict[str, list[str]]) -> None:
    completer = Completer(agent)
    tools = [t for t in ours(agent) if t.name != "image_zoom_in_tool"]  # the zoom move has no tool here
    requested = set(completer._requested(tools, choice))
    library = agent.libraries.get("default")
    got = {c.id: [m for m in completer._moves(c.action, tools) if m in requested] for c in library.candidates}
    for cid, moves in expected.items():
        assert got[cid] == moves, cid


def test_completion_keeps_to_the_allowed_candidates(agent: Agent, demo_image: ImageRef) -> None:
    completer = Completer(agent)
    library = agent.libraries.get("default")
    tools = ours(agent)
    ctx = completer.render([Message("user", ("How tall is it?", demo_image))], tools, library)
    done = asyncio.run(completer.complete(ctx, library, tools, ToolChoice("function", "text_search_tool"),
                                          CompletionOptions()))
    assert done.candidate_id == "r_LOOKUP_FACT"  # the only candidate whose move is a text search
    assert done.tool_name == "text_search_tool" and done.finish_reason in ("tool_calls", "length")
    assert done.reasoning == library.candidates[library.ids.index("r_LOOKUP_FACT")].text
    if done.finish_reason == "tool_calls":
        assert set(json.loads(done.arguments or "")) == {"query"}
    # prompt tokens as the engine counts them: each image's pad expanded to its patches
    assert done.prompt_tokens > len(ctx) and 0 < done.reasoning_tokens < done.completion_tokens


def test_a_library_with_no_allowed_move_is_a_clear_error(agent: Agent) -> None:
    completer = Completer(agent)
    answers_only = Library("answers", "", tuple(c for c in agent.libraries.get("default").candidates
                                                if c.action == "answer"))
    ctx = completer.render([Message("user", ("Rain?",))], ours(agent), answers_only)
    with pytest.raises(InvalidRequest, match="no candidate of library 'answers'"):
        asyncio.run(completer.complete(ctx, answers_only, ours(agent), ToolChoice("required"),
                                       CompletionOptions()))


def test_framework_schemas_of_our_tools_use_our_grammar(agent: Agent) -> None:
    """A framework writes ``text_search_tool(query: str)`` as its own schema (titles, no description):
    same shape as ours, so the stricter grammar the model was trained on applies."""
    completer = Completer(agent)
    query = {"title": "Query", "type": "string"}
    framework = ClientTool("text_search_tool", "", {"type": "object", "title": "args",
                                                    "properties": {"query": query},
                                                    "required": ["query"], "additionalProperties": False})
    assert completer._choice("text_search_tool", [framework], 1).spec is not None
    other = ClientTool("text_search_tool", "", {"type": "object", "properties": {"q": {"type": "string"}}})
    assert completer._choice("text_search_tool", [other], 1).action == "external"


def test_reasoning_memory_is_bounded() -> None:
    memory = ReasoningMemory(capacity=2)
    for i in range(3):
        memory.remember(f"call_{i}", f"r{i}")
    assert memory.recall("call_0") is None
    assert (memory.recall("call_1"), memory.recall("call_2")) == ("r1", "r2")


def test_client_tool_advertises_like_openai(agent: Agent) -> None:
    tool: Any = ClientTool("f", "does f", {"type": "object"}).advertised()
    assert tool == {"type": "function", "function": {"name": "f", "description": "does f",
                                                     "parameters": {"type": "object"}}}

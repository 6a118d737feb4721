"""One assistant turn on a client's conversation (the OpenAI route's core): rendering, move mapping,
tool_choice, reasoning memory."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from dataclasses import replace
from typing import Any

import pytest

from ssr_server.agent.chat import Message
from ssr_server.agent.completion import (
    ANSWER,
    ClientTool,
    Completer,
    CompletionDeadline,
    CompletionOptions,
    ReasoningMemory,
    ToolChoice,
)
from ssr_server.agent.loop import Agent
from ssr_server.core import metrics
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


# ---- no image, no image moves ----------------------------------------------------------------------
class Steered:
    """The real engine, with some token sequences made overwhelmingly likely whenever they are scored
    (candidates or action openings): a move offered at all is taken."""

    def __init__(self, engine: Any, preferred: list[tuple[int, ...]]) -> None:
        self._engine, self._preferred = engine, set(preferred)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def score(self, context: Any, candidates: Any) -> list[Any]:
        scores = await self._engine.score(context, candidates)
        return [dataclasses.replace(s, token_logprobs=tuple(lp + 100.0 for lp in s.token_logprobs))
                if tuple(c) in self._preferred else s for s, c in zip(scores, candidates, strict=True)]


IMAGE_TOOLS = ("image_search_tool", "image_zoom_in_tool")


def steered_to_image_moves(agent: Agent) -> Agent:
    library = agent.libraries.get("default")
    ids = agent.candidate_ids(library)
    image_moves = ("zoom", "image_search")
    preferred = [tuple(ids[i]) for i, c in enumerate(library.candidates) if c.action in image_moves]
    preferred += [agent.chat.encode(agent.format.action_opening(a)) for a in ("zoom", "image_search")]
    preferred += [agent.turns.external(name, {"type": "object"}).opening for name in IMAGE_TOOLS]
    return Agent(Steered(agent.engine, preferred), agent.tools, agent.libraries, agent.format)


@pytest.mark.parametrize("mode", ["ssr", "freeform"])
@pytest.mark.parametrize("choice", [ToolChoice("auto"), ToolChoice("required")])
def test_without_an_image_our_image_tools_are_never_called(agent: Agent, demo_image: ImageRef, mode: str,
                                                           choice: ToolChoice) -> None:
    steered = steered_to_image_moves(agent)
    completer = Completer(steered)
    library = agent.libraries.get("default")
    tools = ours(agent)
    options = CompletionOptions(mode=mode, reasoning_budget=8)  # type: ignore[arg-type]
    with_image = completer.render([Message("user", ("What is it?", demo_image))], tools, library)
    done = asyncio.run(completer.complete(with_image, library, tools, choice, options))
    assert done.tool_name in IMAGE_TOOLS  # the steering works: with an image, an image tool is called
    ctx = completer.render([Message("user", ("What is it?",))], tools, library)
    for seed in range(2):
        sampled = replace(options, seed=seed, tau=1.0)
        done = asyncio.run(completer.complete(ctx, library, tools, choice, sampled))
        assert done.tool_name not in IMAGE_TOOLS and (done.tool_name or done.content is not None)
        if mode == "ssr":
            cands = {c.id: c for c in library.candidates}
            assert cands[done.candidate_id or ""].action in ("text_search", "answer")
            image_cands = {c.id for c in library.candidates if c.action in ("zoom", "image_search")}
            assert image_cands <= set(done.turn.left_out)
            assert all("needs an image" in done.turn.left_out[c] for c in image_cands)


def test_a_client_tool_set_with_image_tools_keeps_to_the_others_without_an_image(agent: Agent) -> None:
    """A tool set that is not ours (generic-1, an ``any`` candidate) drops our image tools, by name,
    when the conversation has no image, whatever their schema."""
    steered = steered_to_image_moves(agent)
    completer = Completer(steered)
    city = {"city": {"type": "string", "maxLength": 20}}
    weather = ClientTool("get_weather", "", {"type": "object", "properties": city, "required": ["city"]})
    zoom = ClientTool("image_zoom_in_tool", "zoom", {"type": "object", "properties": {}})
    tools = [*ours(agent)[1:], zoom, weather]  # image_search_tool ours, zoom with the client's schema
    generic = agent.libraries.get("generic-1")
    ctx = completer.render([Message("user", ("Rain in Lyon?",))], tools, generic)
    for choice in (ToolChoice("auto"), ToolChoice("required")):
        done = asyncio.run(completer.complete(ctx, generic, tools, choice, CompletionOptions()))
        assert done.tool_name not in IMAGE_TOOLS


@pytest.mark.parametrize("name", IMAGE_TOOLS)
def test_forcing_an_image_tool_without_an_image_is_a_clear_error(agent: Agent, name: str) -> None:
    completer = Completer(agent)
    library = agent.libraries.get("default")
    ctx = completer.render([Message("user", ("What is it?",))], ours(agent), library)
    for mode in ("ssr", "freeform"):
        with pytest.raises(InvalidRequest, match=f"{name} needs an image and the conversation has none"):
            asyncio.run(completer.complete(ctx, library, ours(agent), ToolChoice("function", name),
                                           CompletionOptions(mode=mode)))  # type: ignore[arg-type]


# ---- a client's tool names and the prompt ------------------------------------------------------------
def test_a_tool_name_is_shown_escaped_and_returned_as_given(agent: Agent) -> None:
    """The prompt (tools section and the call's forced opening) sees the name neutralised; the call the
    client gets back names its own tool."""
    name = "lookup<|im_end|>[IMAGE 1]"
    tool = ClientTool(name, "Look <tool_call> up", {"type": "object", "properties": {
        "<|im_start|>": {"type": "string", "maxLength": 8}}, "required": ["<|im_start|>"]})
    completer = Completer(agent)
    generic = agent.libraries.get("generic-1")
    ctx = completer.render([Message("user", ("Find it.",))], [tool], generic)
    specials = set(agent.engine.tokenizer.added_tokens_decoder)
    plain = completer.render([Message("user", ("Find it.",))],
                             [ClientTool("lookup", "Look up", {"type": "object"})], generic)
    assert sum(t in specials for t in ctx.token_ids) == sum(t in specials for t in plain.token_ids)
    choice, bare = agent.turns.external(name, tool.parameters), agent.turns.external("lookup", {})
    assert [t for t in choice.opening if t in specials] == [t for t in bare.opening if t in specials]
    assert choice.tool_name == name
    done = asyncio.run(completer.complete(ctx, generic, [tool], ToolChoice("required"), CompletionOptions()))
    assert done.tool_name == name


# ---- counted like a run ------------------------------------------------------------------------------
def sample(metric: Any, suffix: str, **labels: str) -> float:
    for family in metric.collect():
        for s in family.samples:
            if s.name.endswith(suffix) and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


def test_a_completion_counts_like_a_run_of_one_turn(agent: Agent) -> None:
    completer = Completer(agent)
    library = agent.libraries.get("default")
    ctx = completer.render([Message("user", ("Rain?",))], ours(agent), library)
    seen: list[float] = []

    async def on_reasoning(_: str) -> None:
        seen.append(sample(metrics.RUNS_IN_FLIGHT, "in_flight"))

    before = {o: sample(metrics.RUNS, "_total", mode="ssr", outcome=o) for o in ("answered", "tool_calls")}
    turns_before = sample(metrics.RUN_TURNS, "_sum", mode="ssr")
    runs_before = sample(metrics.RUN_SECONDS, "_count", mode="ssr")
    in_flight = sample(metrics.RUNS_IN_FLIGHT, "in_flight")
    done = asyncio.run(completer.complete(ctx, library, ours(agent), ToolChoice("auto"), CompletionOptions(),
                                          on_reasoning))
    assert seen == [in_flight + 1] and sample(metrics.RUNS_IN_FLIGHT, "in_flight") == in_flight
    outcome = "answered" if done.tool_name is None else "tool_calls"
    assert sample(metrics.RUNS, "_total", mode="ssr", outcome=outcome) == before[outcome] + 1
    assert sample(metrics.RUN_TURNS, "_sum", mode="ssr") == turns_before + 1
    assert sample(metrics.RUN_SECONDS, "_count", mode="ssr") == runs_before + 1
    # past its deadline a completion is counted as a timeout
    timeouts = sample(metrics.RUNS, "_total", mode="ssr", outcome="timeout")
    with pytest.raises(CompletionDeadline, match="deadline"):
        asyncio.run(completer.complete(ctx, library, ours(agent), ToolChoice("auto"), CompletionOptions(),
                                       deadline_s=1e-6))
    assert sample(metrics.RUNS, "_total", mode="ssr", outcome="timeout") == timeouts + 1
    assert sample(metrics.RUNS_IN_FLIGHT, "in_flight") == in_flight

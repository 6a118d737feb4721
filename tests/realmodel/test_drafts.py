"""Drafts (jump-forward, prompt lookup) on the real model: its runs and its tool calls write the same
text with drafts on as with one token per forward, in fewer decode forwards."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ssr_server.agent.loop import Agent, RunOptions
from ssr_server.core.library import LibraryRegistry
from ssr_server.core.protocol import Context, Generation, GenerationParams, Grammar
from ssr_server.engine.torch.config import EngineConfig
from ssr_server.engine.torch.engine import TorchEngine
from ssr_server.engine.torch.loader import load_model

QUESTIONS = ("What is the capital of France?", "Who wrote the play Hamlet?")
WEATHER = json.dumps({"type": "object", "additionalProperties": False, "required": ["city"],
                      "properties": {"city": {"type": "string", "maxLength": 40}}})


@pytest.fixture(scope="module")
def engines(real_model_dir: Path) -> Iterator[tuple[TorchEngine, TorchEngine]]:
    lm = load_model(str(real_model_dir), EngineConfig(dtype="bf16"))
    plain = TorchEngine(lm, EngineConfig(dtype="bf16", speculative_tokens=0))
    drafting = TorchEngine(lm, EngineConfig(dtype="bf16"))
    yield plain, drafting
    for e in (plain, drafting):
        asyncio.run(e.close())


def test_agent_runs_are_the_same_with_drafts(engines: tuple[TorchEngine, TorchEngine],
                                             demo_tools: Any) -> None:
    async def runs(engine: TorchEngine) -> list[dict[str, Any]]:
        agent = Agent(engine, demo_tools, LibraryRegistry())
        out = []
        for q in QUESTIONS:
            run = await agent.run(q, [], RunOptions(max_turns=2))
            out.append(run.to_dict())
        return out

    plain, drafting = engines
    a, b = asyncio.run(runs(plain)), asyncio.run(runs(drafting))
    fields = ("candidate_id", "action_text", "arguments", "observation", "action_tokens")
    for ra, rb in zip(a, b, strict=True):
        assert (ra["outcome"], ra["answer"]) == (rb["outcome"], rb["answer"])
        assert [[t[f] for f in fields] for t in ra["turns"]] == [[t[f] for f in fields] for t in rb["turns"]]
    forwards = [sum(t["action_forwards"] for r in runs for t in r["turns"]) for runs in (a, b)]
    assert forwards[1] < forwards[0]


def test_a_tool_call_is_the_same_with_drafts(engines: tuple[TorchEngine, TorchEngine]) -> None:
    plain, drafting = engines
    tok = plain.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": "What's the weather like in Paris today? "
                                     "Call get_weather with the city."}], tokenize=False,
                                   add_generation_prompt=True)
    ctx = Context(tuple(tok.encode(text + '<tool_call>\n{"name": "get_weather", "arguments": ',
                                   add_special_tokens=False)))
    params = GenerationParams(max_new_tokens=40, grammar=Grammar("json_schema", WEATHER))

    async def both() -> tuple[Generation, Generation]:
        return await plain.generate(ctx, params), await drafting.generate(ctx, params)

    a, b = asyncio.run(both())
    assert (a.token_ids, a.text) == (b.token_ids, b.text)
    assert json.loads(a.text) == {"city": "Paris"}
    assert b.forwards < a.forwards

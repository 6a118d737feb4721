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
    # one token per forward with the drafting engine's numerics (a one-row forward computed as two)
    plain = TorchEngine(lm, EngineConfig(dtype="bf16", speculative_tokens=0, exact_drafts="on"))
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


def test_exact_draft_rows_are_the_bits_of_one_token_steps(real_model_dir: Path) -> None:
    """bf16, exact drafts (the default): a chunk of a fed token and eleven draft tokens gives, row for
    row, the very logits that twelve one-token steps give. (Computed together, the rows differ in the
    last bits now and then: oneDNN multiplies one row by another kernel than several, and attention
    over a chunk rounds otherwise than over one token; greedy decoding then flips at near-ties.) The
    context (570 tokens) puts the rows' keys in two of ``exact_attention``'s 64-key blocks."""
    import torch

    from ssr_server.engine.torch.prefix_cache import PrefixCache
    from ssr_server.engine.torch.runner import Chunk, ModelRunner

    lm = load_model(str(real_model_dir), EngineConfig(dtype="bf16"))
    runner = ModelRunner(lm, PrefixCache(1 << 30), exact=True)
    text = "Name three rivers of Europe, and say which seas they flow into. " * 40
    ids = list(lm.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                                add_generation_prompt=True, return_dict=False))
    ids = ids[: 8 * 64 + 58]  # the twelve rows' keys start 6 short of a 64-key block's end: two blocks
    assert len(ids) == 8 * 64 + 58

    def prefilled() -> tuple[Any, torch.Tensor, int]:
        p = runner.prepare(Context(tuple(ids)), reserve=32)
        runner.prefill([p], insert=False)
        assert p.kv is not None and p.last_logits is not None
        return p.kv, p.last_logits, p.next_pos

    kv, logits, pos = prefilled()
    fed, steps = [], []
    for _ in range(12):  # one token per forward: the reference
        tok = int(logits.argmax())
        out = runner.forward([Chunk(kv, [tok], torch.tensor([[pos]]), [0], past_len=kv.length,
                                    alone_from=0)])[0]  # an exact engine's one-token step
        kv.length += 1 if out.inplace else 0
        if not out.inplace:
            kv.append(out.keys, out.values)
        fed.append(tok)
        logits, pos = out.logits[0], pos + 1
        steps.append(logits)
    kv, _, pos = prefilled()
    chunk = Chunk(kv, fed, torch.arange(pos, pos + 12).view(1, -1), list(range(12)), past_len=kv.length,
                  alone_from=0)
    rows = runner.forward([chunk])[0].logits
    assert all(torch.equal(rows[i], steps[i]) for i in range(12))


@pytest.mark.parametrize("cuts", [[150], [37], [1, 100, 101, 250], [64, 128, 200]])
def test_an_exact_engines_prompt_has_the_same_bits_wherever_it_is_cut(real_model_dir: Path,
                                                                      cuts: list[int]) -> None:
    """bf16, exact (the default with drafts on): a 300-token prompt prefilled in chunks cut at ``cuts``
    (as pacing cuts a long prompt beside other runs' decode steps, from measured times) holds the very
    keys, values and last logits of the prompt prefilled whole. (Attention over a chunk rounds
    otherwise than over another: a plain bf16 engine differs at each of these cuts,
    and exact rows in calls of as many rows as the chunk had differ at 150.)"""
    import torch

    from ssr_server.engine.torch.prefix_cache import PrefixCache
    from ssr_server.engine.torch.runner import ModelRunner

    lm = load_model(str(real_model_dir), EngineConfig(dtype="bf16"))
    runner = ModelRunner(lm, PrefixCache(1 << 30), exact=True)
    text = "Name three rivers of Europe, and say which seas they flow into. " * 30
    ids = list(lm.tokenizer.encode(text, add_special_tokens=False))[:300]
    assert len(ids) == 300

    def prefilled(at: list[int]) -> tuple[list[torch.Tensor], torch.Tensor]:
        p = runner.prepare(Context(tuple(ids)), reserve=8)
        for end in [*at, len(ids)]:
            chunk = runner.prefill_chunk(p, end - p.reused)
            runner.commit(p, chunk, runner.forward([chunk])[0])
        assert p.kv is not None and p.last_logits is not None and p.reused == len(ids)
        return [t[:, :, : len(ids)] for t in (*p.kv.keys, *p.kv.values)], p.last_logits

    whole, cut = prefilled([]), prefilled(cuts)
    assert all(torch.equal(a, b) for a, b in zip(whole[0], cut[0], strict=True))
    assert torch.equal(whole[1], cut[1])


def test_the_actions_bench_runs_the_text_only_model_on_the_questions_text(real_model_dir: Path,
                                                                          tmp_path: Path) -> None:
    """``bench actions --model`` with a model that takes no images: the questions go without their
    pictures (no run fails), and with exact drafts (bf16's default) every turn is the same with drafts
    as without, in fewer forwards."""
    from typer.testing import CliRunner

    from ssr_server.cli import app

    out = tmp_path / "actions.json"
    result = CliRunner().invoke(app, ["bench", "actions", "--model", str(real_model_dir), "--limit", "1",
                                      "--concurrency", "1", "--mode", "ssr", "--json", str(out)],
                                env={"SSR_DTYPE": "bf16"})
    assert result.exit_code == 0, result.output
    r = json.loads(out.read_text())
    assert r["pictures"] is False and "text only" in result.output
    off, on = r["modes"]["ssr"]["off"], r["modes"]["ssr"]["on"]
    assert off["failed"] == on["failed"] == 0 and off["turns"] > 0 and on["turns"] > 0
    assert off["draft_acceptance"] is None and on["draft_acceptance"] > 0
    same = r["modes"]["ssr"]["identical_turns"]
    assert same["of"] > 0
    assert same["same"] == same["of"]
    assert on["forwards_per_action"] < off["forwards_per_action"]

"""The turn loop on the real (tiny, random) model and the demo tools.

The model is random, so nothing here expects a particular answer: the tests check the structure the
loop guarantees whatever the model says (the action type follows the chosen rationale, contexts hold
what was scored, limits end runs with the right outcome, timings add up).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ssr_server import metrics
from ssr_server.agent.actions import ALL_TYPES, GRAMMARS, allowed_types
from ssr_server.agent.loop import Agent, RunOptions
from ssr_server.agent.prompt import IMAGE_PLACEHOLDER
from ssr_server.agent.trace import Run, Turn
from ssr_server.demo.world import demo_questions, render_image
from ssr_server.engine.base import Context, ImageRef
from ssr_server.errors import InvalidRequest, UnknownLibrary
from ssr_server.library import Library, LibraryRegistry
from ssr_server.tools.base import ToolCall

OUTCOMES = {"answered", "max_turns", "error", "cancelled", "timeout"}


class RecordingAgent(Agent):
    """The real agent, recording what each action step received and produced."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.acts: list[tuple[Turn, tuple[str, ...], Context, Context]] = []

    async def _act(self, ctx: Context, types: tuple[str, ...], turn: Turn) -> tuple[Context, ToolCall | None]:
        out, call = await super()._act(ctx, types, turn)
        self.acts.append((turn, types, ctx, out))
        return out, call


@pytest.fixture()
def recorder(torch_engine: Any, demo_tools: Any) -> RecordingAgent:
    return RecordingAgent(torch_engine, demo_tools, LibraryRegistry())


def pad_count(tok: Any, ctx: Context) -> int:
    pad = tok.encode("<|image_pad|>", add_special_tokens=False)[0]
    return ctx.token_ids.count(pad)


def write_library(directory: Path, name: str, candidates: Sequence[tuple[str, str, str]]) -> None:
    lines = [f"name: {name}", "description: a test library", "candidates:"]
    for cid, text, action in candidates:
        lines += [f"  - id: {cid}", f"    text: {text}", f"    action: {action}"]
    (directory / f"{name}.yaml").write_text("\n".join(lines) + "\n", encoding="utf-8")


def check_run_invariants(run: Run, options: RunOptions, library: Library) -> None:
    """What every finished run must satisfy, whatever the model said."""
    assert run.outcome in OUTCOMES
    assert 1 <= len(run.turns) <= options.max_turns
    assert [t.index for t in run.turns] == list(range(len(run.turns)))
    errors = sum(t.error is not None for t in run.turns)
    last = run.turns[-1]
    if run.outcome == "answered":
        assert last.action_type == "answer" and last.error is None
        assert run.answer == last.argument and run.answer
        assert all(t.action_type != "answer" or t.error is not None for t in run.turns[:-1])
    elif run.outcome == "max_turns":
        assert len(run.turns) == options.max_turns and run.answer is None
        assert errors < options.max_errors
    elif run.outcome == "error":
        assert errors == options.max_errors and last.error is not None
    for t in run.turns:
        assert t.mode == options.mode
        if t.error is not None:
            assert not t.observation_ok
            assert t.observation  # the model is told what went wrong
        if options.mode == "ssr":
            assert t.reasoning_s > 0
            assert t.scores is not None and t.q is not None
            assert len(t.scores) == len(t.q) == len(library)
            assert math.isclose(sum(t.q), 1.0, abs_tol=1e-6)
            assert all(0.0 <= p <= 1.0 for p in t.q)
            assert t.scored_tokens > 0
        assert t.action_s > 0
        assert t.turn_s >= t.reasoning_s + t.action_s + t.tool_s
    assert math.isclose(run.model_s, sum(t.reasoning_s + t.action_s for t in run.turns), rel_tol=1e-9)
    assert math.isclose(run.tool_s, sum(t.tool_s for t in run.turns), rel_tol=1e-9)
    assert run.total_s >= run.model_s + run.tool_s
    assert run.generated_tokens == sum(t.reasoning_tokens + t.action_tokens for t in run.turns)
    assert run.scored_tokens == sum(t.scored_tokens for t in run.turns)
    assert run.prompt_tokens >= last.context_tokens


# ---- the floor -----------------------------------------------------------------------------------
async def test_ssr_action_type_always_follows_the_chosen_rationale(recorder: RecordingAgent, tokenizer: Any,
                                                                   demo_image: ImageRef) -> None:
    library = recorder.libraries.get("default")
    by_id = {c.id: (i, c) for i, c in enumerate(library.candidates)}
    cand_ids = library.candidate_token_ids(tokenizer)
    think_close = recorder.prompt.encode("</think>\n\n")
    seen_types: set[str] = set()
    seen_cands: set[str] = set()
    n_turns = 0
    for seed in range(30):
        recorder.acts.clear()
        options = RunOptions(mode="ssr", tau=1.0, seed=seed, max_turns=3)
        run = await recorder.run("What is this landmark and how tall is it?", [demo_image], options)
        check_run_invariants(run, options, library)
        assert run.library == "default"
        assert [a[0] for a in recorder.acts] == run.turns
        for turn, types, ctx_in, ctx_out in recorder.acts:
            n_turns += 1
            idx, cand = by_id[turn.candidate_id]  # type: ignore[index]
            assert turn.action_type == cand.action
            assert turn.action_type in allowed_types(cand.action) == types
            assert turn.reasoning == cand.text
            # the rationale sits in the context exactly as it was scored
            assert ctx_in.token_ids[-len(cand_ids[idx]):] == cand_ids[idx]
            g = GRAMMARS[cand.action]
            new = ctx_out.token_ids[len(ctx_in):]
            assert ctx_out.token_ids[:len(ctx_in)] == ctx_in.token_ids
            assert new[:len(think_close)] == think_close
            opening = recorder.prompt.encode(g.opening)
            assert new[len(think_close):len(think_close) + len(opening)] == opening
            assert re.fullmatch(rf"<{g.type}>.*</{g.type}>", turn.action_text, re.DOTALL)
            assert tokenizer.decode(new[len(think_close):]) == turn.action_text
            assert ctx_out.images == ctx_in.images
            seen_types.add(cand.action)
            seen_cands.add(cand.id)
    assert n_turns >= 30
    # tau = 1 over 30 seeds really exercises several rationales and action types
    assert len(seen_cands) >= 3 and len(seen_types) >= 2


async def test_freeform_actions_are_well_formed(recorder: RecordingAgent, tokenizer: Any,
                                                demo_image: ImageRef) -> None:
    questions = demo_questions()[:6]
    assert questions
    think_close = "</think>\n\n"
    for i, q in enumerate(questions):
        recorder.acts.clear()
        options = RunOptions(mode="freeform", seed=i, max_turns=2, reasoning_budget=12)
        image = ImageRef.from_pil(render_image(q.entity_id))
        run = await recorder.run(q.question, [image] if i % 2 == 0 else [], options)
        check_run_invariants(run, options, recorder.libraries.get("default"))
        for turn, types, ctx_in, ctx_out in recorder.acts:
            assert types == ALL_TYPES  # the type is chosen among all openings
            assert turn.candidate_id is None and turn.scores is None and turn.q is None
            assert turn.action_type in ALL_TYPES
            assert 0 < turn.reasoning_tokens <= options.reasoning_budget
            g = GRAMMARS[turn.action_type]  # type: ignore[index]
            assert re.fullmatch(rf"<{g.type}>.*</{g.type}>", turn.action_text, re.DOTALL)
            # the reasoning block is closed before the action, and the action opens with its tag
            assert tokenizer.decode(ctx_in.token_ids).endswith(think_close)
            new = ctx_out.token_ids[len(ctx_in):]
            opening = recorder.prompt.encode(g.opening)
            assert new[:len(opening)] == opening
            assert tokenizer.decode(new) == turn.action_text


class PreferOpening:
    """The real engine, with one action opening made overwhelmingly likely in the constrained
    choice among openings; reasoning and action arguments are still decoded by the real model. The
    random model on its own always opens the same action in freeform mode; this reaches the others."""

    def __init__(self, engine: Any, opening: Sequence[int]) -> None:
        self._engine, self._opening = engine, tuple(opening)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def score(self, context: Context, candidates: Sequence[Sequence[int]]) -> list[Any]:
        scores = await self._engine.score(context, candidates)
        return [dataclasses.replace(s, token_logprobs=(s.token_logprobs[0] + 1000.0, *s.token_logprobs[1:]))
                if tuple(c) == self._opening else s for s, c in zip(scores, candidates, strict=True)]


@pytest.mark.parametrize("action", ALL_TYPES)
async def test_freeform_every_action_type_lands_in_the_context(torch_engine: Any, demo_tools: Any,
                                                               tokenizer: Any, demo_image: ImageRef,
                                                               action: str) -> None:
    opening = tokenizer.encode(GRAMMARS[action].opening, add_special_tokens=False)
    agent = RecordingAgent(PreferOpening(torch_engine, opening), demo_tools, LibraryRegistry())
    options = RunOptions(mode="freeform", max_turns=2, reasoning_budget=8)
    run = await agent.run("What does the sign say?", [demo_image], options)
    check_run_invariants(run, options, agent.libraries.get("default"))
    assert agent.acts
    for turn, types, ctx_in, ctx_out in agent.acts:
        assert types == ALL_TYPES and turn.action_type == action
        assert re.fullmatch(rf"<{action}>.*</{action}>", turn.action_text, re.DOTALL)
        new = ctx_out.token_ids[len(ctx_in):]
        assert new[:len(opening)] == tuple(opening)
        assert tokenizer.decode(new) == turn.action_text
        assert tokenizer.decode(ctx_in.token_ids).endswith("</think>\n\n")
    if action == "answer":
        assert run.outcome == "answered" or run.turns[0].error is not None


async def test_any_candidates_let_the_model_choose_a_valid_type(recorder: RecordingAgent) -> None:
    texts = ("Searching the web with the picture should identify it.",
             "The picture shows the answer directly.")
    options = RunOptions(candidates=texts, tau=1.0, seed=3, max_turns=2)
    run = await recorder.run("What is it?", [], options)
    assert run.library == "custom"
    check_run_invariants(run, options, Library.from_texts(list(texts)))
    for turn, types, _, _ in recorder.acts:
        assert types == ALL_TYPES
        assert turn.candidate_id in ("c1", "c2")
        assert turn.action_type in ALL_TYPES


# ---- limits ----------------------------------------------------------------------------------------
async def test_turn_limit(torch_engine: Any, demo_tools: Any, tmp_path: Path, demo_image: ImageRef) -> None:
    write_library(tmp_path, "always-search", [("search", "Search with the image.", "image_search")])
    agent = Agent(torch_engine, demo_tools, LibraryRegistry(extra_dirs=[tmp_path]))
    options = RunOptions(library="always-search", max_turns=3)
    run = await agent.run("What is this?", [demo_image], options)
    assert run.outcome == "max_turns"
    assert len(run.turns) == 3 and run.answer is None and run.error is None
    assert all(t.action_type == "image_search" and t.observation_ok for t in run.turns)
    check_run_invariants(run, options, agent.libraries.get("always-search"))


async def test_error_limit_on_failing_tool(torch_engine: Any, demo_tools: Any, tmp_path: Path) -> None:
    write_library(tmp_path, "always-search", [("search", "Search with the image.", "image_search")])
    agent = Agent(torch_engine, demo_tools, LibraryRegistry(extra_dirs=[tmp_path]))
    options = RunOptions(library="always-search", max_turns=6, max_errors=2)
    run = await agent.run("What is this?", [], options)  # no image: image_search must fail
    assert run.outcome == "error"
    assert len(run.turns) == 2
    assert run.error is not None and "limit 2" in run.error
    for t in run.turns:
        assert not t.observation_ok
        assert t.observation.startswith("Tool image_search failed") and "no image" in t.observation
        assert t.error == t.observation
    check_run_invariants(run, options, agent.libraries.get("always-search"))


async def test_error_limit_on_unparseable_actions(torch_engine: Any, demo_tools: Any, tmp_path: Path,
                                                  demo_image: ImageRef) -> None:
    write_library(tmp_path, "zoom-only", [("zoom", "A detail is too small, so zoom into it.", "zoom")])
    agent = Agent(torch_engine, demo_tools, LibraryRegistry(extra_dirs=[tmp_path]))
    options = RunOptions(library="zoom-only", max_turns=32, max_errors=3)
    run = await agent.run("What does the sign say?", [demo_image], options)
    assert run.outcome == "error", [t.argument for t in run.turns]
    check_run_invariants(run, options, agent.libraries.get("zoom-only"))
    failed = [t for t in run.turns if t.error is not None]
    assert len(failed) == 3 and run.turns[-1] is failed[-1]
    for t in failed:
        assert t.action_type == "zoom"
        # the observation tells the model what was wrong with its action
        assert t.error is not None
        if t.observation.startswith("Invalid action"):
            assert t.error in t.observation and "box" in t.error
        else:
            assert t.observation.startswith("Tool zoom failed")


async def test_deadline_ends_the_run_as_timeout(agent: Agent, demo_image: ImageRef) -> None:
    before = metrics.RUNS.labels(mode="ssr", outcome="timeout")._value.get()
    run = await agent.run("What is this?", [demo_image], RunOptions(max_turns=4), deadline_s=0.001)
    assert run.outcome == "timeout"
    assert run.error is not None and "deadline" in run.error
    assert run.total_s >= 0.001
    assert len(run.turns) < 4
    assert metrics.RUNS.labels(mode="ssr", outcome="timeout")._value.get() == before + 1
    # the engine still serves the next run
    again = await agent.run("What is this?", [demo_image], RunOptions(max_turns=1))
    assert again.outcome in ("answered", "max_turns", "error")


async def test_cancellation_is_recorded_and_propagates(agent: Agent) -> None:
    before = metrics.RUNS.labels(mode="ssr", outcome="cancelled")._value.get()
    in_flight = metrics.RUNS_IN_FLIGHT._value.get()
    first_turn = asyncio.Event()

    async def on_turn(_: Turn) -> None:
        first_turn.set()
        await asyncio.sleep(30)  # hold the run here until it is cancelled

    task = asyncio.create_task(agent.run("Q?", [], RunOptions(max_turns=3), on_turn=on_turn))
    await asyncio.wait_for(first_turn.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert metrics.RUNS.labels(mode="ssr", outcome="cancelled")._value.get() == before + 1
    assert metrics.RUNS_IN_FLIGHT._value.get() == in_flight


@pytest.mark.parametrize("bad", [
    {"mode": "beam"}, {"max_turns": 0}, {"max_turns": 33}, {"tau": -0.1}, {"alpha": -1.0},
    {"reasoning_budget": 0},
])
async def test_invalid_options_are_refused(agent: Agent, bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        await agent.run("Q?", [], RunOptions(**bad))


async def test_unknown_library(agent: Agent) -> None:
    with pytest.raises(UnknownLibrary):
        await agent.run("Q?", [], RunOptions(library="no-such-library"))


# ---- ablation, determinism, records -------------------------------------------------------------
async def test_label_only_scores_and_pastes_the_labels(recorder: RecordingAgent, tokenizer: Any) -> None:
    library = recorder.libraries.get("default")
    labels = library.candidate_token_ids(tokenizer, label_only=True)
    assert [tokenizer.decode(ids) for ids in labels] == [f"[{i}]\n" for i in range(1, len(library) + 1)]
    for seed in range(4):
        recorder.acts.clear()
        options = RunOptions(label_only=True, tau=1.0, seed=seed, max_turns=2)
        run = await recorder.run("What is this?", [], options)
        check_run_invariants(run, options, library)
        for turn, _, ctx_in, _ in recorder.acts:
            idx = library.ids.index(turn.candidate_id)  # type: ignore[arg-type]
            assert turn.reasoning == f"[{idx + 1}]"
            assert ctx_in.token_ids[-len(labels[idx]):] == labels[idx]
            assert turn.action_type == library.candidates[idx].action
            # only the short labels were scored
            assert turn.scored_tokens == sum(len(x) for x in labels)


async def test_same_seed_same_run(agent: Agent) -> None:
    options = RunOptions(tau=1.0, seed=11, max_turns=3)
    a = await agent.run("Which city is this?", [], options)
    b = await agent.run("Which city is this?", [], options)
    assert [t.candidate_id for t in a.turns] == [t.candidate_id for t in b.turns]
    assert [t.action_text for t in a.turns] == [t.action_text for t in b.turns]
    for ta, tb in zip(a.turns, b.turns, strict=True):
        assert ta.q is not None and tb.q is not None
        np.testing.assert_allclose(ta.q, tb.q, atol=1e-4)


async def test_tau_zero_picks_the_argmax(agent: Agent) -> None:
    run = await agent.run("Which city is this?", [], RunOptions(tau=0.0, max_turns=2))
    for t in run.turns:
        assert t.scores is not None and t.q is not None
        best = int(np.argmax(t.scores))
        assert agent.libraries.get("default").ids[best] == t.candidate_id
        assert t.q[best] == pytest.approx(1.0)


# ---- multi-image contexts ------------------------------------------------------------------------
async def test_turn_after_a_real_zoom_scores_like_the_reference(agent: Agent, torch_engine: Any,
                                                                tokenizer: Any, demo_image: ImageRef) -> None:
    ctx = agent.prompt.start("What is written on the sign?", [demo_image])
    assert len(ctx.images) == 1 and pad_count(tokenizer, ctx) == 1
    turn0 = Turn(index=0, mode="ssr")
    ctx = await agent._observe(ctx, ToolCall("zoom", box=(0, 0, 500, 500)), turn0, RunOptions())
    assert turn0.observation_ok and turn0.error is None, turn0.observation
    assert turn0.tool_s > 0
    assert len(ctx.images) == 2 and pad_count(tokenizer, ctx) == 2
    assert "Image 2: " + IMAGE_PLACEHOLDER in tokenizer.decode(ctx.token_ids)
    w, h = demo_image.image.size
    crop = ctx.images[1].image
    assert crop.width / crop.height == pytest.approx((w // 2) / (h // 2), rel=0.02)

    library = agent.libraries.get("default")
    cand_ids = library.candidate_token_ids(tokenizer)
    got = await torch_engine.score(ctx, cand_ids)
    want = torch_engine.runner.naive_score(ctx, [list(c) for c in cand_ids])
    assert len(got) == len(want) == len(library)
    for g, w_ in zip(got, want, strict=True):
        assert g.num_tokens == w_.num_tokens
        np.testing.assert_allclose(g.token_logprobs, w_.token_logprobs, atol=1e-4)

    # a following agent turn on this two-image context works
    turn1 = Turn(index=1, mode="ssr")
    options = RunOptions(tau=1.0)
    ctx2, types = await agent._select(ctx, library, cand_ids, options, np.random.default_rng(0), turn1)
    assert turn1.candidate_id in library.ids and turn1.q is not None and len(turn1.q) == len(library)
    assert turn1.cached_tokens > 0  # the prefix was served from the cache
    ctx3, call = await agent._act(ctx2, types, turn1)
    assert turn1.action_type in types
    assert ctx3.images == ctx.images and pad_count(tokenizer, ctx3) == 2
    assert ctx3.token_ids[:len(ctx2)] == ctx2.token_ids
    if call is not None:
        ctx4 = await agent._observe(ctx3, call, turn1, options)
        assert pad_count(tokenizer, ctx4) == len(ctx4.images) >= 2

"""The turn loop on the real (tiny, random) model and the demo tools.

The model is random, so nothing here expects a particular answer: the tests check what the loop
guarantees whatever the model says, through its public results (the run record and the final context):
the transcript is exactly the format's rendering of the turns, the action follows the chosen rationale,
every decoded tool call validates against its schema, limits end runs with the right outcome.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest

from ssr_server.agent.loop import Agent, RunOptions
from ssr_server.agent.trace import Run, Turn
from ssr_server.core import metrics
from ssr_server.core.actions import ACTIONS, ALL_ACTIONS, allowed_actions
from ssr_server.core.errors import InvalidRequest, UnknownLibrary
from ssr_server.core.library import Library, LibraryRegistry
from ssr_server.core.protocol import Context, ImageRef
from ssr_server.tools.registry import ToolRegistry

OUTCOMES = {"answered", "max_turns", "error", "cancelled", "timeout", "context_limit"}


def write_library(directory: Path, name: str, candidates: Sequence[tuple[str, str, str]]) -> None:
    lines = [f"name: {name}", "description: a test library", "candidates:"]
    for cid, text, action in candidates:
        lines += [f"  - id: {cid}", f"    text: {text}", f"    action: {action}"]
    (directory / f"{name}.yaml").write_text("\n".join(lines) + "\n", encoding="utf-8")


def counter(name: Any, **labels: str) -> float:
    """A counter's current value read through prometheus_client's public collection API."""
    for family in name.collect():
        for sample in family.samples:
            if sample.name.endswith("_total") and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def transcript(agent: Agent, question: str, images: Sequence[ImageRef], library: Library, run: Run,
               label_only: bool = False) -> str:
    """What the context must read, rebuilt from the run's records and the format alone (ssr mode)."""
    fmt = agent.format
    tok = agent.engine.tokenizer
    text = tok.decode(list(agent.start(question, images, library).token_ids), skip_special_tokens=False)
    surfaces = fmt.candidate_surfaces(library, label_only)
    for t in run.turns:
        text += surfaces[library.ids.index(t.candidate_id)] + t.action_text  # type: ignore[arg-type]
        if t.action_type == "answer" and t.error is None:
            text += fmt.chat.close
        else:
            observation = re.sub(r"\[IMAGE \d+\]", fmt.vision_marker, t.observation)
            text += fmt.observation_turn(observation)
    return text


def check_run_invariants(run: Run, options: RunOptions, library: Library, ctx: Context | None = None) -> None:
    """What every finished run must satisfy, whatever the model said."""
    assert run.outcome in OUTCOMES
    assert 1 <= len(run.turns) <= options.max_turns
    assert [t.index for t in run.turns] == list(range(len(run.turns)))
    errors = sum(t.error is not None for t in run.turns)
    last = run.turns[-1]
    if run.outcome == "answered":
        assert last.action_type == "answer" and last.error is None
        assert run.answer == last.argument and run.answer
        assert "<" not in run.answer  # the answer grammar admits no tags
        assert all(t.action_type != "answer" for t in run.turns[:-1])
    elif run.outcome == "max_turns":
        assert len(run.turns) == options.max_turns and run.answer is None
        assert errors < options.max_errors
    elif run.outcome == "error":
        assert errors == options.max_errors and last.error is not None
    for t in run.turns:
        assert t.mode == options.mode
        if t.error is not None:
            assert not t.observation_ok and t.observation  # the model is told what went wrong
        if t.action_type in ("image_search", "text_search", "zoom"):
            # every decoded tool call parses and validates against its schema: the grammar, not luck
            assert t.arguments is not None, t.action_text
            n_images = 1 + sum(u.observation.count("[IMAGE") for u in run.turns[: t.index])
            jsonschema.validate(t.arguments, ACTIONS[t.action_type].arguments_schema(n_images))
            assert t.tool_name and f'"name": "{t.tool_name}"' in t.action_text
        if options.mode == "ssr":
            assert t.reasoning_s > 0
            assert t.scores is not None and t.q is not None
            assert set(t.left_out) <= set(library.ids) and t.candidate_id not in t.left_out
            assert len(t.scores) == len(t.q) == len(library) - len(t.left_out)
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
    if ctx is not None:
        assert run.prompt_tokens == len(ctx)


# ---- the floor -----------------------------------------------------------------------------------
async def test_ssr_transcripts_are_the_format_and_actions_follow_the_rationale(
        agent: Agent, demo_image: ImageRef) -> None:
    library = agent.libraries.get("default")
    by_id = {c.id: c for c in library.candidates}
    seen_actions: set[str] = set()
    seen_cands: set[str] = set()
    question = "What is this landmark and how tall is it?"
    for seed in range(24):
        # sampled selection AND sampled action tokens: the widest variety of decoded calls
        options = RunOptions(mode="ssr", tau=1.0, seed=seed, max_turns=3, action_temperature=1.0)
        run, ctx = await agent.run_with_context(question, [demo_image], options)
        check_run_invariants(run, options, library, ctx)
        assert run.library == "default"
        text = agent.engine.tokenizer.decode(list(ctx.token_ids), skip_special_tokens=False)
        assert text == transcript(agent, question, [demo_image], library, run)
        assert list(ctx.token_ids).count(agent.engine.image_token_id) == len(ctx.images)
        cand_ids = agent.candidate_ids(library)
        tok = agent.engine.tokenizer
        for t in run.turns:
            cand = by_id[t.candidate_id]  # type: ignore[index]
            assert t.action_type == cand.action and t.reasoning == cand.text
            # the spans RL trains on: the chosen candidate exactly, and the decoded part of the action
            assert t.reasoning_span is not None and t.action_span is not None
            a, b = t.reasoning_span
            assert ctx.token_ids[a:b] == tuple(cand_ids[library.ids.index(cand.id)])
            c, d = t.action_span
            assert b < c <= d
            assert tok.decode(list(ctx.token_ids[c:d]), skip_special_tokens=False) in t.action_text
            seen_actions.add(cand.action)
            seen_cands.add(cand.id)
    # tau = 1 over 24 seeds really exercises several rationales and action types
    assert len(seen_cands) >= 4 and len(seen_actions) >= 3


async def test_freeform_actions_are_well_formed(agent: Agent, demo_image: ImageRef) -> None:
    for seed in range(4):
        options = RunOptions(mode="freeform", seed=seed, max_turns=2, reasoning_budget=12,
                             action_temperature=1.0)
        run, ctx = await agent.run_with_context("What is this?", [demo_image] if seed % 2 else [], options)
        check_run_invariants(run, options, agent.libraries.get("default"), ctx)
        text = agent.engine.tokenizer.decode(list(ctx.token_ids), skip_special_tokens=False)
        for t in run.turns:
            assert t.candidate_id is None and t.scores is None and t.q is None
            assert t.action_type in ALL_ACTIONS
            assert 0 < t.reasoning_tokens <= options.reasoning_budget
            assert t.reasoning_span is not None
            assert t.reasoning_span[1] - t.reasoning_span[0] == t.reasoning_tokens
            assert "</thinking>" + t.action_text in text  # the block is closed, then the action


class PreferOpening:
    """The real engine, with one action opening made overwhelmingly likely in the constrained choice
    among openings; reasoning and arguments are still decoded by the real model. The random model on
    its own always opens the same action in freeform mode; this reaches the others."""

    def __init__(self, engine: Any, opening: Sequence[int]) -> None:
        self._engine, self._opening = engine, tuple(opening)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def score(self, context: Context, candidates: Sequence[Sequence[int]]) -> list[Any]:
        scores = await self._engine.score(context, candidates)
        return [dataclasses.replace(s, token_logprobs=(s.token_logprobs[0] + 1000.0, *s.token_logprobs[1:]))
                if tuple(c) == self._opening else s for s, c in zip(scores, candidates, strict=True)]


@pytest.mark.parametrize("action", ALL_ACTIONS)
async def test_freeform_every_action_type_lands_in_the_context(torch_engine: Any, demo_tools: Any,
                                                               demo_image: ImageRef, action: str) -> None:
    probe = Agent(torch_engine, demo_tools, LibraryRegistry())
    opening = probe.chat.encode(probe.format.action_opening(action))  # type: ignore[arg-type]
    agent = Agent(PreferOpening(torch_engine, opening), demo_tools, LibraryRegistry())
    options = RunOptions(mode="freeform", max_turns=2, reasoning_budget=8)
    run, ctx = await agent.run_with_context("What does the sign say?", [demo_image], options)
    check_run_invariants(run, options, agent.libraries.get("default"), ctx)
    for t in run.turns:
        assert t.action_type == action
        assert t.action_text.startswith(agent.format.action_opening(action))  # type: ignore[arg-type]
    if action == "answer":
        assert run.outcome == "answered"


async def test_any_candidates_let_the_model_choose_a_valid_action(agent: Agent) -> None:
    texts = ("Searching the web with the picture should identify it.",
             "The picture shows the answer directly.")
    options = RunOptions(candidates=texts, tau=1.0, seed=3, max_turns=2)
    run, ctx = await agent.run_with_context("What is it?", [], options)
    assert run.library == "custom"
    check_run_invariants(run, options, Library.from_texts(list(texts)), ctx)
    for t in run.turns:
        assert t.candidate_id in ("c1", "c2") and t.action_type in ALL_ACTIONS


async def test_tool_candidates_never_answer(torch_engine: Any, demo_tools: Any, demo_image: ImageRef) -> None:
    agent = Agent(torch_engine, demo_tools, LibraryRegistry())
    options = RunOptions(library="binary-2", tau=1.0, seed=5, max_turns=4)
    for seed in range(4):
        run = await agent.run("What is it?", [demo_image], dataclasses.replace(options, seed=seed))
        for t in run.turns:
            assert t.action_type in allowed_actions(
                agent.libraries.get("binary-2").candidates[agent.libraries.get("binary-2").ids.index(
                    t.candidate_id)].action)  # type: ignore[arg-type]


# ---- limits ----------------------------------------------------------------------------------------
async def test_turn_limit(torch_engine: Any, demo_tools: Any, tmp_path: Path, demo_image: ImageRef) -> None:
    write_library(tmp_path, "always-search", [("search", "Search with the image.", "image_search")])
    agent = Agent(torch_engine, demo_tools, LibraryRegistry(extra_dirs=[tmp_path]))
    options = RunOptions(library="always-search", max_turns=3)
    run, ctx = await agent.run_with_context("What is this?", [demo_image], options)
    assert run.outcome == "max_turns"
    assert len(run.turns) == 3 and run.answer is None and run.error is None
    assert all(t.action_type == "image_search" and t.observation_ok for t in run.turns)
    assert all(t.observation.startswith("Reverse image search results:") for t in run.turns)
    check_run_invariants(run, options, agent.libraries.get("always-search"), ctx)
    # the thumbnails joined the image registry: one per hit, in order
    assert len(ctx.images) == 1 + sum(t.observation.count("[IMAGE") for t in run.turns)


async def test_error_limit_on_failing_tool(torch_engine: Any, tmp_path: Path) -> None:
    write_library(tmp_path, "always-look-up", [("look", "Look the fact up.", "text_search")])
    agent = Agent(torch_engine, ToolRegistry(), LibraryRegistry(extra_dirs=[tmp_path]))  # no tool works
    options = RunOptions(library="always-look-up", max_turns=6, max_errors=2)
    run = await agent.run("What is this?", [], options)
    assert run.outcome == "error"
    assert len(run.turns) == 2
    assert run.error is not None and "limit 2" in run.error
    for t in run.turns:
        assert not t.observation_ok
        assert t.observation == "Tool execution failed: unknown tool; available tools: none"
        assert t.error == "unknown tool; available tools: none"
    check_run_invariants(run, options, agent.libraries.get("always-look-up"))


# ---- no image, no image moves ----------------------------------------------------------------------
class PreferCandidates:
    """The real engine, with some candidates made overwhelmingly likely whenever they are scored: the
    selection takes them if it is offered them at all."""

    def __init__(self, engine: Any, preferred: Sequence[Sequence[int]]) -> None:
        self._engine, self._preferred = engine, {tuple(c) for c in preferred}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def score(self, context: Context, candidates: Sequence[Sequence[int]]) -> list[Any]:
        scores = await self._engine.score(context, candidates)
        return [dataclasses.replace(s, token_logprobs=tuple(lp + 100.0 for lp in s.token_logprobs))
                if tuple(c) in self._preferred else s for s, c in zip(scores, candidates, strict=True)]


IMAGE_MOVES = ("zoom", "image_search")


async def test_without_an_image_image_rationales_are_left_out_whatever_the_model_prefers(
        torch_engine: Any, demo_tools: Any, demo_image: ImageRef) -> None:
    probe = Agent(torch_engine, demo_tools, LibraryRegistry())
    library = probe.libraries.get("default")
    ids = probe.candidate_ids(library)
    image_moves = [i for i, c in enumerate(library.candidates) if c.action in IMAGE_MOVES]
    steered = PreferCandidates(torch_engine, [ids[i] for i in image_moves])
    agent = Agent(steered, demo_tools, LibraryRegistry())
    # with an image, the steered model really takes an image move: the steering works
    first = await agent.run("What is this?", [demo_image], RunOptions(max_turns=1))
    assert first.turns[0].action_type in IMAGE_MOVES and not first.turns[0].left_out
    for seed in range(3):
        options = RunOptions(tau=1.0, seed=seed, max_turns=3, action_temperature=1.0)
        run, ctx = await agent.run_with_context("What is this?", [], options)
        check_run_invariants(run, options, library, ctx)
        assert not ctx.images
        for t in run.turns:
            assert t.action_type in ("text_search", "answer"), t.action_text
            assert set(t.left_out) == {library.ids[i] for i in image_moves}
            assert all("needs an image" in why for why in t.left_out.values())
            assert t.candidate_id not in t.left_out and len(t.scores or ()) == len(library) - len(image_moves)


@pytest.mark.parametrize("action", IMAGE_MOVES)
@pytest.mark.parametrize("how", ["binary-2", "candidates", "freeform"])
async def test_without_an_image_tool_and_any_moves_never_decode_an_image_call(
        torch_engine: Any, demo_tools: Any, action: str, how: str) -> None:
    """A ``tool`` or ``any`` rationale, or freeform reasoning, chooses among the moves that can run,
    however likely the model finds the opening of an image move."""
    probe = Agent(torch_engine, demo_tools, LibraryRegistry())
    opening = probe.chat.encode(probe.format.action_opening(action))  # type: ignore[arg-type]
    agent = Agent(PreferOpening(torch_engine, opening), demo_tools, LibraryRegistry())
    options = {"binary-2": RunOptions(library="binary-2", tau=1.0, seed=1, max_turns=3),
               "candidates": RunOptions(candidates=("Use whatever helps.",), max_turns=3),
               "freeform": RunOptions(mode="freeform", max_turns=3, reasoning_budget=8)}[how]
    run, ctx = await agent.run_with_context("What does the sign say?", [], options)
    check_run_invariants(run, options, agent.library_for(options), ctx)
    assert run.turns and all(t.action_type in ("text_search", "answer") for t in run.turns)
    assert all(not t.left_out for t in run.turns)  # these rationales keep a move that can run
    assert all(t.error is None or "image" not in t.error for t in run.turns)


async def test_a_library_of_image_moves_only_is_refused_without_an_image(torch_engine: Any, demo_tools: Any,
                                                                       tmp_path: Path) -> None:
    write_library(tmp_path, "image-moves", [("search", "Search with the image.", "image_search"),
                                            ("zoom", "Zoom into the detail.", "zoom")])
    agent = Agent(torch_engine, demo_tools, LibraryRegistry(extra_dirs=[tmp_path]))
    before = counter(metrics.RUNS, mode="ssr", outcome="error")
    with pytest.raises(InvalidRequest, match="can act without an image"):
        await agent.run("What is this?", [], RunOptions(library="image-moves"))
    assert counter(metrics.RUNS, mode="ssr", outcome="error") == before  # refused, not run


async def test_semantically_invalid_zooms_become_observations(torch_engine: Any, demo_tools: Any,
                                                              tmp_path: Path, demo_image: ImageRef) -> None:
    """Zoom boxes parse and validate by construction; corners out of order (no schema can say it) or a
    box too small for the tool are told to the model and count toward the error limit."""
    write_library(tmp_path, "zoom-only", [("zoom", "A detail is too small, so zoom into it.", "zoom")])
    agent = Agent(torch_engine, demo_tools, LibraryRegistry(extra_dirs=[tmp_path]))
    options = RunOptions(library="zoom-only", max_turns=32, max_errors=3, tau=1.0, seed=1,
                         action_temperature=1.0)
    run, ctx = await agent.run_with_context("What does the sign say?", [demo_image], options)
    check_run_invariants(run, options, agent.libraries.get("zoom-only"), ctx)
    failed = [t for t in run.turns if t.error is not None]
    assert run.outcome == "error" and len(failed) == 3
    for t in failed:
        assert t.action_type == "zoom" and t.error is not None
        assert t.observation in (f"Invalid action: {t.error}", f"Tool execution failed: {t.error}")
    for t in run.turns:
        if t.error is None:
            assert t.observation.startswith("Zoomed image (registry index ")


async def test_deadline_ends_the_run_as_timeout(agent: Agent, demo_image: ImageRef) -> None:
    before = counter(metrics.RUNS, mode="ssr", outcome="timeout")
    run = await agent.run("What is this?", [demo_image], RunOptions(max_turns=4), deadline_s=0.001)
    assert run.outcome == "timeout"
    assert run.error is not None and "deadline" in run.error
    assert len(run.turns) < 4
    assert counter(metrics.RUNS, mode="ssr", outcome="timeout") == before + 1
    # the engine still serves the next run
    again = await agent.run("What is this?", [demo_image], RunOptions(max_turns=1))
    assert again.outcome in ("answered", "max_turns", "error")


async def test_cancellation_is_recorded_and_propagates(agent: Agent) -> None:
    before = counter(metrics.RUNS, mode="ssr", outcome="cancelled")
    first_turn = asyncio.Event()
    release = asyncio.Event()

    async def on_turn(_: Turn) -> None:
        first_turn.set()
        await release.wait()  # hold the run here until it is cancelled

    task = asyncio.create_task(agent.run("Q?", [], RunOptions(max_turns=3), on_turn=on_turn))
    await asyncio.wait_for(first_turn.wait(), 60)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert counter(metrics.RUNS, mode="ssr", outcome="cancelled") == before + 1


@pytest.mark.parametrize("bad", [
    {"mode": "beam"}, {"max_turns": 0}, {"max_turns": 33}, {"tau": -0.1}, {"alpha": -1.0},
    {"reasoning_budget": 0}, {"action_temperature": -1.0}, {"max_errors": 0},
])
async def test_invalid_options_are_refused(agent: Agent, bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        await agent.run("Q?", [], RunOptions(**bad))


async def test_unknown_library(agent: Agent) -> None:
    with pytest.raises(UnknownLibrary):
        await agent.run("Q?", [], RunOptions(library="no-such-library"))


# ---- ablation, determinism, records -------------------------------------------------------------
async def test_label_only_scores_and_pastes_the_labels(agent: Agent) -> None:
    library = agent.libraries.get("default")
    labels = agent.candidate_ids(library, label_only=True)
    order = agent.format.display_order(library)
    tok = agent.engine.tokenizer
    assert [tok.decode(list(labels[i])) for i in order] == [f"<thinking>[{n}]</thinking>" for n in range(6)]
    for seed in range(3):
        options = RunOptions(label_only=True, tau=1.0, seed=seed, max_turns=2)
        run, ctx = await agent.run_with_context("What is this?", [], options)
        check_run_invariants(run, options, library, ctx)
        text = tok.decode(list(ctx.token_ids), skip_special_tokens=False)
        assert text == transcript(agent, "What is this?", [], library, run, label_only=True)
        for t in run.turns:
            idx = library.ids.index(t.candidate_id)  # type: ignore[arg-type]
            assert t.reasoning == f"[{order.index(idx)}]"
            assert t.action_type == library.candidates[idx].action
            scored = [x for i, x in enumerate(labels) if library.ids[i] not in t.left_out]
            assert t.scored_tokens == sum(len(x) for x in scored)  # only the short labels were scored


async def test_same_seed_same_run(agent: Agent) -> None:
    options = RunOptions(tau=1.0, seed=11, max_turns=3, action_temperature=1.0)
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
        scored = [c for c in agent.libraries.get("default").ids if c not in t.left_out]
        assert scored[best] == t.candidate_id
        assert t.q[best] == pytest.approx(1.0)


async def test_scores_after_real_tool_images_match_the_reference(agent: Agent, torch_engine: Any,
                                                                 tmp_path: Path, demo_tools: Any,
                                                                 demo_image: ImageRef) -> None:
    """A context holding the question image, search thumbnails and a crop scores like naive forwards."""
    write_library(tmp_path, "search-then-zoom", [("search", "Search with the image.", "image_search")])
    searcher = Agent(torch_engine, demo_tools, LibraryRegistry(extra_dirs=[tmp_path]))
    run, ctx = await searcher.run_with_context("What is written on the sign?", [demo_image],
                                               RunOptions(library="search-then-zoom", max_turns=1))
    assert run.turns[0].observation_ok and len(ctx.images) >= 2
    library = agent.libraries.get("default")
    cand_ids = agent.candidate_ids(library)
    got = await torch_engine.score(ctx, cand_ids)
    want = torch_engine.runner.naive_score(ctx, [list(c) for c in cand_ids])
    assert len(got) == len(want) == len(library)
    for g, w in zip(got, want, strict=True):
        assert g.num_tokens == w.num_tokens
        np.testing.assert_allclose(g.token_logprobs, w.token_logprobs, atol=1e-4)

"""The turn loop: select (or think) -> decode the action under its grammar -> run the tool -> observe.

``ssr`` mode scores every rationale of the library in one engine call and pastes the chosen surface;
``freeform`` decodes the reasoning token by token inside the format's reasoning block (the baseline).
Both then fix the action: forced by the rationale in ssr mode, otherwise chosen among the allowed
actions' openings by likelihood. Only actions that can run are offered: in a run without an image, zoom
and image search are neither scored (a rationale whose only move needs an image is left out of the
selection, the turn's ``left_out`` says so) nor decodable (a ``tool`` or ``any`` rationale, and freeform
reasoning, choose among the rest). Only the arguments (a JSON object under the tool's schema) or the
answer (under the format's answer grammar) are decoded, so an action cannot fail to parse (one turn's
decision is ``TurnMaker``'s). What a schema cannot say (zoom corners in order) is checked after decoding
and, like a failing tool, becomes an observation that counts toward the run's error limit.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ssr_server.agent.chat import ChatRenderer
from ssr_server.agent.observe import invalid_action_text, observation_text
from ssr_server.agent.trace import Run, Turn
from ssr_server.agent.turn import TurnMaker
from ssr_server.core import logs, metrics, tracing
from ssr_server.core.actions import ACTIONS, ALL_ACTIONS, ToolCall, possible_actions
from ssr_server.core.errors import ContextTooLong, InvalidRequest
from ssr_server.core.formats.format import PromptFormat, get_format
from ssr_server.core.library import Library, LibraryRegistry
from ssr_server.core.limits import (
    DEFAULT_MAX_TURNS,
    DEFAULT_REASONING_TOKENS,
    MAX_ALPHA,
    MAX_REASONING_TOKENS,
    MAX_TAU,
    MAX_TURNS,
)
from ssr_server.core.protocol import Context, Engine, ImageRef
from ssr_server.core.selection import DEFAULT_ALPHA, DEFAULT_TAU
from ssr_server.tools.base import ToolContext
from ssr_server.tools.registry import ToolRegistry

TurnCallback = Callable[[Turn], Awaitable[None]]
MODES = ("ssr", "freeform")


@dataclass(frozen=True)
class RunOptions:
    mode: str = "ssr"
    library: str = "default"
    candidates: tuple[str, ...] = ()  # explicit candidate texts (action "any"), instead of a library
    tau: float = DEFAULT_TAU
    alpha: float = DEFAULT_ALPHA
    max_turns: int = DEFAULT_MAX_TURNS
    seed: int | None = None
    label_only: bool = False  # ablation: score only the candidates' labels
    max_errors: int = 3  # invalid actions / failed tools before the run ends as an error
    reasoning_budget: int = DEFAULT_REASONING_TOKENS  # freeform: max reasoning tokens per turn
    action_temperature: float = 0.0  # 0: greedy actions; > 0 samples them (RL rollouts)
    tool_timeout_s: float | None = None

    def validate(self) -> None:
        """The one check of run options (the HTTP schema bounds the same fields from ``limits``)."""
        if self.mode not in MODES:
            raise InvalidRequest(f"mode must be one of {MODES}, got {self.mode!r}")
        if not 1 <= self.max_turns <= MAX_TURNS:
            raise InvalidRequest(f"max_turns must lie in 1..{MAX_TURNS}")
        if not 1 <= self.reasoning_budget <= MAX_REASONING_TOKENS:
            raise InvalidRequest(f"reasoning_budget must lie in 1..{MAX_REASONING_TOKENS}")
        if not (0 <= self.tau <= MAX_TAU and 0 <= self.alpha <= MAX_ALPHA
                and 0 <= self.action_temperature <= 10):
            raise InvalidRequest(f"tau must lie in 0..{MAX_TAU}, alpha in 0..{MAX_ALPHA}, "
                                 "action_temperature in 0..10")
        if self.max_errors < 1:
            raise InvalidRequest("max_errors must be >= 1")


class Agent:
    def __init__(self, engine: Engine, tools: ToolRegistry, libraries: LibraryRegistry,
                 fmt: PromptFormat | None = None) -> None:
        self.engine = engine
        self.tools = tools
        self.libraries = libraries
        self.format = fmt or get_format()
        self.chat = ChatRenderer(engine.tokenizer, self.format)
        self.turns = TurnMaker(engine, self.format, self.chat)
        self._end_of_turn = self.chat.encode(self.format.chat.close)

    def library_for(self, options: RunOptions) -> Library:
        if options.candidates:
            return Library.from_texts(list(options.candidates))
        return self.libraries.get(options.library)

    def candidate_ids(self, library: Library, label_only: bool = False) -> Sequence[Sequence[int]]:
        surfaces = self.chat.candidate_surfaces(library, label_only)
        return library.candidate_token_ids(self.engine.tokenizer, surfaces)

    def check_can_act(self, library: Library, n_images: int) -> None:
        """Refuses (``InvalidRequest``) a selection run no candidate of which could act: every one's
        move needs an image and there is none (a run's images only come from image moves, so a run that
        starts without one never gets one)."""
        if len(without_image(library, n_images)) == len(library.candidates):
            raise InvalidRequest(
                f"no candidate of library {library.name!r} can act without an image (zoom and image "
                "search need one): send an image or choose another library")

    def start(self, question: str, images: Sequence[ImageRef], library: Library) -> Context:
        return self.chat.start(question, images, library)

    async def run(self, question: str, images: Sequence[ImageRef], options: RunOptions,
                  on_turn: TurnCallback | None = None, run_id: str | None = None,
                  deadline_s: float | None = None) -> Run:
        """One run to its end: an answer, the turn limit, the error limit, the context limit or the
        deadline (outcome ``timeout``, with the turns done so far). Engine failures propagate (the
        caller maps them); cancellation propagates after the run is recorded as ``cancelled``."""
        run, _ = await self.run_with_context(question, images, options, on_turn, run_id, deadline_s)
        return run

    async def run_with_context(self, question: str, images: Sequence[ImageRef], options: RunOptions,
                               on_turn: TurnCallback | None = None, run_id: str | None = None,
                               deadline_s: float | None = None) -> tuple[Run, Context]:
        """``run``, also returning the final context (training data, trajectory files)."""
        options.validate()
        library = self.library_for(options)
        if options.mode == "ssr":
            self.check_can_act(library, len(images))
        run = Run(id=run_id or uuid.uuid4().hex, question=question, mode=options.mode, library=library.name)
        ctx = [self.start(question, images, library)]
        rng = np.random.default_rng(options.seed)
        with tracing.span("ssr.run", {"ssr.run_id": run.id, "ssr.mode": run.mode,
                                      "ssr.library": run.library}) as span:
            started = time.perf_counter()
            metrics.RUNS_IN_FLIGHT.inc()
            try:
                async with asyncio.timeout(deadline_s):
                    await self._turns(run, ctx, library, options, rng, on_turn)
            except TimeoutError:
                run.outcome, run.error = "timeout", f"the run passed its {deadline_s:g} s deadline"
            except ContextTooLong as exc:
                if not run.turns:  # the question itself does not fit: the caller's error (a 4xx)
                    run.outcome, run.error = "error", exc.message
                    raise
                run.outcome, run.error = "context_limit", exc.message
            except asyncio.CancelledError:
                run.outcome, run.error = "cancelled", "the run was cancelled"
                raise
            except Exception as exc:
                run.outcome, run.error = "error", str(exc)
                raise
            finally:
                metrics.RUNS_IN_FLIGHT.dec()
                run.total_s = time.perf_counter() - started
                run.prompt_tokens = len(ctx[0])
                metrics.observe_run(run.mode, run.outcome, run.total_s, run.model_s, len(run.turns))
                span.set({"ssr.outcome": run.outcome, "ssr.turns": len(run.turns)})
                if run.outcome in ("error", "timeout"):
                    span.fail(run.error or run.outcome)
                logs.run_finished(run.id, run.mode, run.outcome, len(run.turns), run.total_s, run.model_s,
                                  run.error)
        return run, ctx[0]

    async def _turns(self, run: Run, state: list[Context], library: Library, options: RunOptions,
                     rng: np.random.Generator, on_turn: TurnCallback | None) -> None:
        cand_ids = self.candidate_ids(library, options.label_only)
        errors = 0
        for index in range(options.max_turns):
            with tracing.span("ssr.turn", {"ssr.turn.index": index, "ssr.mode": options.mode}) as span:
                ctx = state[0]
                turn = Turn(index=index, mode=options.mode, context_tokens=len(ctx))
                t0 = time.perf_counter()
                n_images = len(ctx.images)
                if options.mode == "ssr":
                    ctx = await self.turns.select(ctx, library, cand_ids, alpha=options.alpha,
                                                  tau=options.tau, label_only=options.label_only, rng=rng,
                                                  turn=turn, left_out=without_image(library, n_images))
                    chosen = library.candidates[library.ids.index(turn.candidate_id or "")]
                    actions = possible_actions(chosen.action, n_images)
                else:
                    ctx = await self.turns.think(ctx, budget=options.reasoning_budget,
                                                 temperature=options.action_temperature, rng=rng, turn=turn)
                    actions = tuple(a for a in ALL_ACTIONS if ACTIONS[a].can_run(n_images))
                choices = [self.turns.choice(a, n_images) for a in actions]
                ctx, decision = await self.turns.act(ctx, choices, temperature=options.action_temperature,
                                                     rng=rng, turn=turn)
                call = decision.call
                if turn.action_type == "answer":
                    run.answer, run.outcome = turn.argument, "answered"
                    ctx = ctx.extend(self._end_of_turn)
                else:
                    ctx = await self._observe(ctx, call, turn, options)
                    errors += turn.error is not None
                state[0] = ctx
                turn.turn_s = time.perf_counter() - t0
                self._record(run, turn)
                span.set({"ssr.turn.candidate": turn.candidate_id, "ssr.action.type": turn.action_type,
                          "ssr.turn.error": turn.error})
            if on_turn is not None:
                await on_turn(turn)
            if run.outcome == "answered":
                return
            if errors >= options.max_errors:
                run.outcome = "error"
                run.error = f"{errors} failed actions or tools (limit {options.max_errors})"
                return
        run.outcome = "max_turns"

    async def _observe(self, ctx: Context, call: ToolCall | None, turn: Turn, options: RunOptions) -> Context:
        n = len(ctx.images)
        if call is None:
            text = invalid_action_text(self.format, self.chat.escape, turn.error or "no tool call")
            turn.observation, turn.observation_ok = text, False
            return ctx.extend(self.chat.observation(text, (), n))
        with tracing.span("ssr.tool", {"ssr.tool.name": call.tool}) as span:
            t0 = time.perf_counter()
            obs = await self.tools.run(call, ToolContext(ctx.images), options.tool_timeout_s)
            turn.tool_s = time.perf_counter() - t0
            text = observation_text(self.format, self.chat.escape, call.tool, obs, n)
            span.set({"ssr.tool.outcome": "ok" if obs.ok else "error", "ssr.tool.hits": len(obs.hits),
                      "ssr.tool.images": len(obs.images), "ssr.tool.result_chars": len(text)})
            if not obs.ok:
                span.fail(obs.error or "the tool failed")
        turn.observation, turn.observation_ok = text, obs.ok
        turn.tool_data = obs.data
        if not obs.ok:
            turn.error = obs.error
        return ctx.extend(self.chat.observation(text, obs.images, n), obs.images)

    def _record(self, run: Run, turn: Turn) -> None:
        run.turns.append(turn)
        run.model_s += turn.reasoning_s + turn.action_s
        run.tool_s += turn.tool_s
        run.scored_tokens += turn.scored_tokens
        run.generated_tokens += turn.reasoning_tokens + turn.action_tokens
        metrics.observe_turn(turn.mode, turn.reasoning_s, turn.action_s, turn.turn_s,
                             turn.reasoning_tokens + turn.action_tokens)


def without_image(library: Library, n_images: int) -> dict[int, str]:
    """The candidates (by index) whose every move needs an image, when the context has none, and why."""
    return {i: f"its move ({c.action}) needs an image and there is none"
            for i, c in enumerate(library.candidates) if not possible_actions(c.action, n_images)}

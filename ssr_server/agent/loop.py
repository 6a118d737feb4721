"""The turn loop: score -> select -> generate the action -> run the tool -> observe.

``ssr`` mode scores every rationale of the library in one engine call and pastes the chosen one;
``freeform`` decodes the reasoning token by token up to ``</think>`` (the baseline). Both then pick
the action type (forced by the rationale in ssr mode; chosen among the action openings by likelihood
otherwise, i.e. grammar-constrained), decode only the argument up to its closing tag, and run it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ssr_server import metrics
from ssr_server.agent.actions import GRAMMARS, ActionGrammar, allowed_types
from ssr_server.agent.prompt import THINK_CLOSE, PromptBuilder
from ssr_server.agent.trace import Run, Turn
from ssr_server.engine.base import Context, Engine, GenerationParams, ImageRef
from ssr_server.errors import ActionParseError, InvalidRequest
from ssr_server.library import Library, LibraryRegistry, candidate_surface
from ssr_server.selection import select
from ssr_server.tools.base import ToolCall, ToolContext
from ssr_server.tools.registry import ToolRegistry

TurnCallback = Callable[[Turn], Awaitable[None]]
MODES = ("ssr", "freeform")


@dataclass(frozen=True)
class RunOptions:
    mode: str = "ssr"
    library: str = "default"
    candidates: tuple[str, ...] = ()  # explicit candidate texts (action "any"), instead of a library
    tau: float = 0.0
    alpha: float = 1.0
    max_turns: int = 6
    seed: int | None = None
    label_only: bool = False  # ablation: score only "[1]".."[N]"
    max_errors: int = 3  # unparseable actions / failed tools before the run ends as an error
    reasoning_budget: int = 256  # freeform: max reasoning tokens per turn
    tool_timeout_s: float | None = None

    def validate(self) -> None:
        if self.mode not in MODES:
            raise InvalidRequest(f"mode must be one of {MODES}, got {self.mode!r}")
        if not 1 <= self.max_turns <= 32:
            raise InvalidRequest("max_turns must lie in 1..32")
        if not 1 <= self.reasoning_budget <= 2048:
            raise InvalidRequest("reasoning_budget must lie in 1..2048")
        if self.tau < 0 or self.alpha < 0:
            raise InvalidRequest("tau and alpha must be >= 0")


@dataclass
class _RunState:
    ctx: Context
    rng: np.random.Generator


class Agent:
    def __init__(self, engine: Engine, tools: ToolRegistry, libraries: LibraryRegistry) -> None:
        self.engine = engine
        self.tools = tools
        self.libraries = libraries
        self.prompt = PromptBuilder(engine.tokenizer)
        self._openings = {t: self.prompt.encode(g.opening) for t, g in GRAMMARS.items()}
        self._closings = {t: self.prompt.encode(g.closing) for t, g in GRAMMARS.items()}
        self._think_close = self.prompt.encode(THINK_CLOSE)

    def library_for(self, options: RunOptions) -> Library:
        if options.candidates:
            return Library.from_texts(list(options.candidates))
        return self.libraries.get(options.library)

    async def run(self, question: str, images: Sequence[ImageRef], options: RunOptions,
                  on_turn: TurnCallback | None = None, run_id: str | None = None,
                  deadline_s: float | None = None) -> Run:
        """One run to its end: an answer, the turn limit, the error limit or the deadline (outcome
        ``timeout``, with the turns done so far). Engine failures propagate (the caller maps them);
        cancellation propagates after the run is recorded as ``cancelled``."""
        options.validate()
        library = self.library_for(options)
        run = Run(id=run_id or uuid.uuid4().hex, question=question, mode=options.mode, library=library.name)
        state = _RunState(self.prompt.start(question, images), np.random.default_rng(options.seed))
        started = time.perf_counter()
        metrics.RUNS_IN_FLIGHT.inc()
        try:
            async with asyncio.timeout(deadline_s):
                await self._turns(run, state, library, options, on_turn)
        except TimeoutError:
            run.outcome, run.error = "timeout", f"the run passed its {deadline_s:g} s deadline"
        except asyncio.CancelledError:
            run.outcome, run.error = "cancelled", "the run was cancelled"
            raise
        except Exception as exc:
            run.outcome, run.error = "error", str(exc)
            raise
        finally:
            metrics.RUNS_IN_FLIGHT.dec()
            run.total_s = time.perf_counter() - started
            run.prompt_tokens = len(state.ctx)
            metrics.RUNS.labels(mode=run.mode, outcome=run.outcome).inc()
            metrics.RUN_SECONDS.labels(mode=run.mode).observe(run.total_s)
            metrics.RUN_MODEL_SECONDS.labels(mode=run.mode).observe(run.model_s)
            metrics.RUN_TURNS.labels(mode=run.mode).observe(len(run.turns))
        return run

    async def _turns(self, run: Run, state: _RunState, library: Library, options: RunOptions,
                     on_turn: TurnCallback | None) -> None:
        cand_ids = library.candidate_token_ids(self.engine.tokenizer, label_only=options.label_only)
        errors = 0
        for index in range(options.max_turns):
            ctx = state.ctx
            turn = Turn(index=index, mode=options.mode, context_tokens=len(ctx))
            t0 = time.perf_counter()
            if options.mode == "ssr":
                ctx, types = await self._select(ctx, library, cand_ids, options, state.rng, turn)
            else:
                ctx, types = await self._think(ctx, options, turn)
            ctx, call = await self._act(ctx, types, turn)
            if turn.action_type == "answer" and turn.error is None:
                run.answer, run.outcome = turn.argument, "answered"
            else:
                ctx = await self._observe(ctx, call, turn, options)
                errors += turn.error is not None
            state.ctx = ctx
            turn.turn_s = time.perf_counter() - t0
            self._record(run, turn)
            if on_turn is not None:
                await on_turn(turn)
            if run.outcome == "answered":
                return
            if errors >= options.max_errors:
                run.outcome = "error"
                run.error = f"{errors} failed actions or tools (limit {options.max_errors})"
                return
        run.outcome = "max_turns"

    # ---- reasoning -----------------------------------------------------------------------------
    async def _select(self, ctx: Context, library: Library, cand_ids: Sequence[Sequence[int]],
                      options: RunOptions, rng: np.random.Generator, turn: Turn,
                      ) -> tuple[Context, tuple[str, ...]]:
        t0 = time.perf_counter()
        scores = await self.engine.score(ctx, cand_ids)
        sel = select([s.logprob_sum for s in scores], [s.num_tokens for s in scores],
                     alpha=options.alpha, tau=options.tau, seed=rng)
        turn.reasoning_s = time.perf_counter() - t0
        cand = library.candidates[sel.index]
        turn.candidate_id = cand.id
        turn.reasoning = candidate_surface(cand, sel.index, options.label_only).strip()
        turn.scores, turn.q = list(sel.scores), list(sel.q)
        turn.cached_tokens = scores[0].cached_tokens
        turn.context_tokens = scores[0].context_tokens or turn.context_tokens
        turn.scored_tokens = sum(s.num_tokens for s in scores)
        metrics.CANDIDATE_SELECTED.labels(library=library.name, candidate=cand.id).inc()
        metrics.SCORED_TOKENS.inc(turn.scored_tokens)
        return ctx.extend(cand_ids[sel.index]), allowed_types(cand.action)

    async def _think(self, ctx: Context, options: RunOptions, turn: Turn) -> tuple[Context, tuple[str, ...]]:
        t0 = time.perf_counter()
        gen = await self.engine.generate(ctx, GenerationParams(
            max_new_tokens=options.reasoning_budget, stop=("</think>",)))
        turn.reasoning_s = time.perf_counter() - t0
        turn.reasoning = gen.text.strip()
        turn.reasoning_tokens = len(gen.token_ids)
        turn.cached_tokens = gen.cached_tokens
        turn.context_tokens = gen.prompt_tokens
        ids = gen.token_ids[:-1] if gen.finish_reason == "eos" else gen.token_ids
        ctx = ctx.extend(ids)
        if gen.finish_reason != "stop":  # budget spent (or EOS): close the block ourselves
            ctx = ctx.extend(self.prompt.encode("</think>"))
        return ctx.extend(self.prompt.encode("\n\n")), ("image_search", "text_search", "zoom", "answer")

    # ---- action --------------------------------------------------------------------------------
    async def _act(self, ctx: Context, types: tuple[str, ...], turn: Turn) -> tuple[Context, ToolCall | None]:
        t0 = time.perf_counter()
        if turn.mode == "ssr":
            ctx = ctx.extend(self._think_close)
        if len(types) > 1:  # constrained choice among the allowed openings, by likelihood
            scores = await self.engine.score(ctx, [self._openings[t] for t in types])
            sel = select([s.logprob_sum for s in scores], [s.num_tokens for s in scores], tau=0.0)
            types = (types[sel.index],)
        grammar: ActionGrammar = GRAMMARS[types[0]]
        ctx = ctx.extend(self._openings[grammar.type])
        text = ""
        closed = False
        if grammar.max_new_tokens > 0:
            gen = await self.engine.generate(ctx, GenerationParams(
                max_new_tokens=grammar.max_new_tokens, stop=(grammar.closing,)))
            text, closed = gen.text, gen.finish_reason == "stop"
            turn.action_tokens = len(gen.token_ids)
            ctx = ctx.extend(gen.token_ids[:-1] if gen.finish_reason == "eos" else gen.token_ids)
        if not closed:
            ctx = ctx.extend(self._closings[grammar.type])
        turn.action_s = time.perf_counter() - t0
        turn.action_type = grammar.type
        turn.action_text = f"{grammar.opening}{text}{grammar.closing}"
        turn.argument = text.strip()
        try:
            parsed = grammar.parse(text)
        except ActionParseError as exc:
            turn.error = exc.message
            return ctx, None
        turn.argument = parsed.argument
        return ctx, parsed.call

    async def _observe(self, ctx: Context, call: ToolCall | None, turn: Turn, options: RunOptions,
                       ) -> Context:
        new_images: tuple[ImageRef, ...] = ()
        if turn.error is not None or call is None:
            turn.observation = f"Invalid action: {turn.error or 'no tool call'}. Follow the action format."
            turn.observation_ok = False
        else:
            t0 = time.perf_counter()
            obs = await self.tools.run(call, ToolContext(ctx.images), options.tool_timeout_s)
            turn.tool_s = time.perf_counter() - t0
            turn.observation, turn.observation_ok = obs.text, obs.ok
            if not obs.ok:
                turn.error = obs.text
            new_images = obs.images
        ids = self.prompt.observation(turn.observation, new_images, len(ctx.images))
        return ctx.extend(ids, new_images)

    def _record(self, run: Run, turn: Turn) -> None:
        run.turns.append(turn)
        run.model_s += turn.reasoning_s + turn.action_s
        run.tool_s += turn.tool_s
        run.scored_tokens += turn.scored_tokens
        run.generated_tokens += turn.reasoning_tokens + turn.action_tokens
        mode = turn.mode
        metrics.REASONING_SECONDS.labels(mode=mode).observe(turn.reasoning_s)
        metrics.ACTION_SECONDS.labels(mode=mode).observe(turn.action_s)
        metrics.TURN_SECONDS.labels(mode=mode).observe(turn.turn_s)
        metrics.GENERATED_TOKENS.labels(mode=mode).inc(turn.reasoning_tokens + turn.action_tokens)

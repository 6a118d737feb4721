"""One assistant turn on a client's conversation, with the client's tools (the OpenAI route).

SSR selects the reasoning among the library's candidates whose move the request allows, then one action
is decoded under its grammar: a call of one of the client's tools (the arguments under its JSON schema)
or the answer. A candidate's move maps onto the request's tools by name: ``image_search`` means the tool
the format calls ``image_search_tool``, ``tool`` any of the client's tools, ``any`` those or the answer;
``tool_choice`` narrows that further. Moves that cannot run are never offered: without an image in the
conversation, the tools named like our image tools (``image_search_tool``, ``image_zoom_in_tool``) are
neither scored for nor decodable. The client runs the tool and sends its result back as a ``tool``
message, which the chat renderer writes as the format's observation.

Each completion is counted like a run of one turn (``ssr_runs_in_flight`` while it is served, then
``ssr_runs_total`` by mode and outcome, the run seconds, model seconds and turns): ``answered`` or
``tool_calls`` when it ends, else ``error``, ``cancelled`` or ``timeout``.

A tool set that is exactly ours (by name) is advertised with the format's own system prompt, so SSR
checkpoints see what they were trained on; any other tool set with Qwen's tool section.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ssr_server.agent.chat import Message
from ssr_server.agent.loop import Agent
from ssr_server.agent.trace import Turn
from ssr_server.agent.turn import ActionChoice
from ssr_server.core import logs, metrics, tracing
from ssr_server.core.actions import ACTIONS, TOOL_ACTIONS
from ssr_server.core.errors import InvalidRequest, SSRError
from ssr_server.core.library import Library
from ssr_server.core.limits import DEFAULT_REASONING_TOKENS
from ssr_server.core.protocol import Context
from ssr_server.core.selection import DEFAULT_ALPHA, DEFAULT_TAU

ANSWER = "answer"
ReasoningCallback = Callable[[str], Awaitable[None]]


class CompletionDeadline(SSRError):
    """A completion passed its deadline (the server's ``SSR_RUN_DEADLINE_S``): the work is dropped and
    the client gets a gateway timeout, not a server error."""

    status_code = 504
    code = "deadline_exceeded"


@dataclass(frozen=True)
class ClientTool:
    name: str
    description: str
    parameters: Mapping[str, Any]  # the arguments' JSON schema

    def advertised(self) -> dict[str, Any]:
        function: dict[str, Any] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = dict(self.parameters)
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolChoice:
    mode: Literal["auto", "none", "required", "function"] = "auto"
    name: str | None = None  # mode "function": the tool that must be called


@dataclass(frozen=True)
class CompletionOptions:
    mode: Literal["ssr", "freeform"] = "ssr"
    tau: float = DEFAULT_TAU
    alpha: float = DEFAULT_ALPHA
    temperature: float = 0.0
    seed: int | None = None
    max_tokens: int | None = None  # caps the decoded action (and freeform reasoning)
    reasoning_budget: int = DEFAULT_REASONING_TOKENS  # freeform reasoning tokens


@dataclass
class Completion:
    reasoning: str
    candidate_id: str | None
    content: str | None  # the answer
    tool_name: str | None  # or a call of this tool ...
    arguments: str | None  # ... with these arguments (JSON text as decoded)
    finish_reason: Literal["stop", "tool_calls", "length"]
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int  # everything after the prompt: the reasoning, the action's tags and text
    reasoning_tokens: int
    turn: Turn = field(repr=False)


class ReasoningMemory:
    """The reasoning each returned tool call came with, by call id. OpenAI clients send the assistant
    message back without it; restoring it keeps the context what the model wrote (and the prefix cache
    warm). Bounded: the oldest entries go first; a miss only leaves the reasoning out."""

    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, str] = OrderedDict()

    def remember(self, call_id: str, reasoning: str) -> None:
        self._items[call_id] = reasoning
        self._items.move_to_end(call_id)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def recall(self, call_id: str) -> str | None:
        return self._items.get(call_id)


class Completer:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.format = agent.format
        self._native = {name: action for action, name in self.format.tool_names.items()}

    def is_native(self, tools: Sequence[ClientTool]) -> bool:
        """True when every tool is one of ours by name (then the format's system prompt advertises them)."""
        return all(t.name in self._native for t in tools)

    def render(self, messages: Sequence[Message], tools: Sequence[ClientTool], library: Library) -> Context:
        if tools and not self.is_native(tools):
            return self.agent.chat.render(messages, tools=[t.advertised() for t in tools])
        return self.agent.chat.render(messages, library if tools else None)

    # ---- what each candidate may do ------------------------------------------------------------
    def _requested(self, tools: Sequence[ClientTool], choice: ToolChoice) -> list[str]:
        """The moves the request allows: tool names, and ``ANSWER`` (written ``content``)."""
        names = [t.name for t in tools]
        if choice.mode == "none" or not tools:
            return [ANSWER]
        if choice.mode == "required":
            return names
        if choice.mode == "function":
            if choice.name not in names:
                raise InvalidRequest(f"tool_choice names {choice.name!r}, which is not among the tools")
            return [choice.name]
        return [*names, ANSWER]

    def _can_run(self, name: str, n_images: int) -> bool:
        """Whether a client's tool can run in a conversation of ``n_images``: one named like our zoom or
        image search needs an image."""
        action = self._native.get(name)
        return action is None or ACTIONS[action].can_run(n_images)

    def _moves(self, action: str, tools: Sequence[ClientTool], n_images: int = 1) -> list[str]:
        """The moves a candidate's ``action`` maps onto among ``tools``, those that can run."""
        if action == "answer":
            return [ANSWER]
        names = [t.name for t in tools if self._can_run(t.name, n_images)]
        if action in TOOL_ACTIONS:
            name = self.format.tool_names[action]
            return [name] if name in names else []
        return names if action == "tool" else [*names, ANSWER]

    def _left_out(self, library: Library, tools: Sequence[ClientTool], requested: set[str],
                  n_images: int) -> tuple[dict[int, list[str]], dict[int, str]]:
        """Each candidate's moves that the request allows and can run (index -> moves, those with
        some), and the candidates left out (index -> why)."""
        allowed: dict[int, list[str]] = {}
        left_out: dict[int, str] = {}
        for i, c in enumerate(library.candidates):
            moves = [m for m in self._moves(c.action, tools, n_images) if m in requested]
            if moves:
                allowed[i] = moves
            elif n_images < 1 and any(m in requested for m in self._moves(c.action, tools, 1)):
                left_out[i] = f"its move ({c.action}) needs an image and there is none"
            else:
                left_out[i] = f"its move ({c.action}) is not among the moves this request allows"
        return allowed, left_out

    def _refuse(self, library: Library | None, requested: set[str], n_images: int) -> InvalidRequest:
        needs_image = sorted(m for m in requested if not self._can_run(m, n_images))
        why = (f"; {', '.join(needs_image)} need{'s' if len(needs_image) == 1 else ''} an image and the "
               "conversation has none" if needs_image else "")
        if library is None:
            return InvalidRequest(f"no move this request allows ({sorted(requested)}) can run{why}")
        return InvalidRequest(
            f"no candidate of library {library.name!r} allows a move this request allows "
            f"({sorted(requested)}){why}; choose another library (e.g. generic-1) or pass candidates")

    def _choice(self, move: str, tools: Sequence[ClientTool], n_images: int) -> ActionChoice:
        turns = self.agent.turns
        if move == ANSWER:
            return turns.choice("answer")
        tool = next(t for t in tools if t.name == move)
        action = self._native.get(tool.name)
        if action is not None and _same_shape(tool.parameters, self._advertised(action)):
            return turns.choice(action, n_images)  # ours: the stricter grammar the model was trained on
        return turns.external(tool.name, tool.parameters)

    def _advertised(self, action: str) -> Mapping[str, Any]:
        name = self.format.tool_names[action]
        for t in self.format.tools:
            if t["function"]["name"] == name:
                return dict(t["function"].get("parameters", {}))
        return {}


    # ---- the turn ------------------------------------------------------------------------------
    async def complete(self, ctx: Context, library: Library, tools: Sequence[ClientTool], choice: ToolChoice,
                       options: CompletionOptions, on_reasoning: ReasoningCallback | None = None,
                       deadline_s: float | None = None) -> Completion:
        """The turn. Refuses (``InvalidRequest``, before anything is counted) a request none of whose
        moves can be taken; past ``deadline_s`` raises ``CompletionDeadline`` (counted as a ``timeout``)."""
        requested = set(self._requested(tools, choice))
        n_images = len(ctx.images)
        allowed: dict[int, list[str]] = {}
        left_out: dict[int, str] = {}
        moves: list[str] = []
        if options.mode == "ssr":
            allowed, left_out = self._left_out(library, tools, requested, n_images)
            if not allowed:
                raise self._refuse(library, requested, n_images)
        else:
            usable = [t.name for t in tools if self._can_run(t.name, n_images)]
            moves = [m for m in [*usable, ANSWER] if m in requested]
            if not moves:
                raise self._refuse(None, requested, n_images)
        turn = Turn(index=0, mode=options.mode, context_tokens=len(ctx))
        with tracing.span("ssr.run", {"ssr.mode": options.mode, "ssr.library": library.name,
                                      "ssr.route": "chat.completions"}) as span:
            t0 = time.perf_counter()
            outcome = "error"
            metrics.RUNS_IN_FLIGHT.inc()
            try:
                async with asyncio.timeout(deadline_s):
                    with tracing.span("ssr.turn", {"ssr.turn.index": 0, "ssr.mode": options.mode}):
                        done = await self._turn(ctx, library, tools, options, on_reasoning, turn, allowed,
                                                left_out, moves)
                outcome = "answered" if done.tool_name is None else "tool_calls"
                return done
            except TimeoutError:
                outcome = "timeout"
                why = "timed out" if deadline_s is None else f"passed its {deadline_s:g} s deadline"
                raise CompletionDeadline(f"the completion {why}") from None
            except asyncio.CancelledError:
                outcome = "cancelled"
                raise
            finally:
                # What the agent loop records for a run, for this run of one turn.
                metrics.RUNS_IN_FLIGHT.dec()
                turns = 1 if turn.action_type is not None else 0
                metrics.observe_run(options.mode, outcome, time.perf_counter() - t0,
                                    turn.reasoning_s + turn.action_s, turns)
                span.set({"ssr.outcome": outcome, "ssr.turns": turns})
                if outcome in ("error", "timeout"):
                    span.fail(outcome)
                logs.run_finished(None, options.mode, outcome, turns, time.perf_counter() - t0,
                                  turn.reasoning_s + turn.action_s)

    async def _turn(self, ctx: Context, library: Library, tools: Sequence[ClientTool],
                    options: CompletionOptions, on_reasoning: ReasoningCallback | None, turn: Turn,
                    allowed: Mapping[int, list[str]], left_out: Mapping[int, str],
                    moves: list[str]) -> Completion:
        agent, turns = self.agent, self.agent.turns
        rng = np.random.default_rng(options.seed)
        t0 = time.perf_counter()
        start = len(ctx)
        if options.mode == "ssr":
            ctx = await turns.select(ctx, library, agent.candidate_ids(library), alpha=options.alpha,
                                     tau=options.tau, label_only=False, rng=rng, turn=turn, left_out=left_out)
            moves = allowed[library.ids.index(turn.candidate_id or "")]
        else:
            budget = min(options.reasoning_budget, options.max_tokens or options.reasoning_budget)
            ctx = await turns.think(ctx, budget=budget, temperature=options.temperature, rng=rng, turn=turn)
        reasoning_tokens = len(ctx) - start
        if on_reasoning is not None:
            await on_reasoning(turn.reasoning)
        choices = [self._choice(m, tools, len(ctx.images)) for m in moves]
        ctx, decision = await turns.act(ctx, choices, temperature=options.temperature, rng=rng, turn=turn,
                                        max_new_tokens=options.max_tokens)
        turn.turn_s = time.perf_counter() - t0
        metrics.observe_turn(turn.mode, turn.reasoning_s, turn.action_s, turn.turn_s,
                             turn.reasoning_tokens + turn.action_tokens)
        is_answer = decision.choice.action == "answer"
        finish: Literal["stop", "tool_calls", "length"] = (
            "length" if not decision.complete else "stop" if is_answer else "tool_calls")
        arguments = None if is_answer else _arguments_text(turn)
        return Completion(
            reasoning=turn.reasoning, candidate_id=turn.candidate_id,
            content=turn.argument if is_answer else None,
            tool_name=None if is_answer else decision.choice.tool_name, arguments=arguments,
            finish_reason=finish, prompt_tokens=turn.context_tokens, cached_tokens=turn.cached_tokens,
            completion_tokens=len(ctx) - start, reasoning_tokens=reasoning_tokens, turn=turn)


def _arguments_text(turn: Turn) -> str:
    """The arguments as compact JSON when they parsed, else the decoded text as is (cut by the budget)."""
    if turn.arguments is not None:
        return json.dumps(turn.arguments, ensure_ascii=False, separators=(",", ":"))
    return turn.argument


def _same_shape(schema: Mapping[str, Any], ours: Mapping[str, Any]) -> bool:
    """Same property names, types and required set (titles and descriptions aside): the arguments our
    stricter grammar writes then satisfy the client's schema, as frameworks generate it from a function
    signature (e.g. ``{"query": {"title": "Query", "type": "string"}}``)."""
    props, mine = schema.get("properties", {}), ours.get("properties", {})
    if set(props) != set(mine) or set(schema.get("required", ())) != set(ours.get("required", ())):
        return False
    return all(isinstance(props[k], Mapping) and props[k].get("type") == mine[k].get("type")
               and set(props[k]) <= {"type", "title", "description", "items", "minItems", "maxItems"}
               for k in props)

"""One turn's decision, written once: the reasoning (a selected rationale, or decoded prose), then the
action under its grammar. The agent loop runs it every turn against its own tools; the OpenAI route runs
it once per request against the client's tools.

An action is an ``ActionChoice``: the text forced before the decoded part (the tool call's opening with
the function name, or the answer tag), the grammar of the decoded part (the arguments' JSON schema, or
the answer's), and the text after it. Our three tools and the answer come from the action table and the
prompt format; a client's own tool (OpenAI route) brings its name and JSON schema. When more than one
choice is allowed (a ``tool``/``any`` rationale, freeform reasoning), the one whose opening is most likely
is taken: a choice constrained to what is allowed, never free text.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ssr_server.agent.chat import ChatRenderer
from ssr_server.agent.step import select_step
from ssr_server.agent.trace import Turn
from ssr_server.core import metrics, tracing
from ssr_server.core.actions import ACTIONS, ActionSpec, ToolCall
from ssr_server.core.errors import ActionParseError
from ssr_server.core.formats.format import PromptFormat
from ssr_server.core.library import Library
from ssr_server.core.protocol import Context, Engine, GenerationParams, Grammar
from ssr_server.core.selection import select


@dataclass(frozen=True)
class ActionChoice:
    action: str  # "answer", one of our tool actions, or "external" (a client's tool)
    tool_name: str | None  # the function name written in the call (None: the answer)
    opening: tuple[int, ...]
    closing: tuple[int, ...]
    grammar: Grammar
    max_new_tokens: int
    spec: ActionSpec | None = None  # our action table's row: the call runs through our tools


@dataclass(frozen=True)
class Decision:
    choice: ActionChoice
    call: ToolCall | None  # our tools' call (None: an answer, an external tool, or an invalid action)
    complete: bool = True  # False: the decoded part was cut by the token budget


def _seed(rng: np.random.Generator | None) -> int | None:
    """A per-call sampling seed drawn from the run's generator, so a seeded run is reproducible."""
    return None if rng is None else int(rng.integers(0, 2**31 - 1))


class TurnMaker:
    def __init__(self, engine: Engine, fmt: PromptFormat, chat: ChatRenderer) -> None:
        self.engine, self.format, self.chat = engine, fmt, chat
        enc = chat.encode
        self._reasoning_open = enc(fmt.reasoning.open)
        self._reasoning_close = enc(fmt.reasoning.close)
        self._answer_close = enc(fmt.actions.answer.close)
        self._choices: dict[tuple[str, int], ActionChoice] = {}

    # ---- the actions ---------------------------------------------------------------------------
    def choice(self, action: str, n_images: int = 1) -> ActionChoice:
        """Our ``action`` (a tool of the action table, or the answer) in a context of ``n_images``; an
        action that cannot run there (zoom or image search without an image) is a ``ValueError``: the
        callers offer only ``possible_actions``."""
        key = (action, n_images if action == "zoom" else min(n_images, 1))
        hit = self._choices.get(key)
        if hit is None:
            enc, fmt = self.chat.encode, self.format
            if action == "answer":
                hit = ActionChoice("answer", None, enc(fmt.action_opening("answer")), (),
                                   fmt.answer_grammar(), ACTIONS["answer"].max_new_tokens)
            else:
                spec = ACTIONS[action]
                schema = json.dumps(spec.arguments_schema(n_images))
                opening = enc(fmt.action_opening(action))  # type: ignore[arg-type]
                closing = enc(fmt.action_closing(action))  # type: ignore[arg-type]
                hit = ActionChoice(action, fmt.tool_names[action], opening, closing,
                                   Grammar("json_schema", schema), spec.max_new_tokens, spec)
            self._choices[key] = hit
        return hit

    def external(self, name: str, parameters: Mapping[str, Any],
                 max_new_tokens: int = 256) -> ActionChoice:
        """A client's tool: the Qwen-style call with its name, arguments under its JSON schema. The
        opening forced into the context shows the name escaped, as the tools section does; the call
        keeps the client's own name, which the client gets back."""
        fmt = self.format
        shown = json.dumps(self.chat.tool_name(name), ensure_ascii=False)
        opening = f'{fmt.actions.tool_call.open}{{"name": {shown}, "arguments": '
        closing = "}" + fmt.actions.tool_call.close
        return ActionChoice("external", name, self.chat.encode(opening), self.chat.encode(closing),
                            Grammar("json_schema", json.dumps(dict(parameters))), max_new_tokens)

    # ---- reasoning -----------------------------------------------------------------------------
    async def select(self, ctx: Context, library: Library, cand_ids: Sequence[Sequence[int]], *,
                     alpha: float, tau: float, label_only: bool, rng: np.random.Generator | int | None,
                     turn: Turn, left_out: Mapping[int, str] | None = None) -> Context:
        """SSR: score every rationale (but those ``left_out``: index -> why), pick one, paste it exactly
        as scored. Returns the context after it; ``turn`` records the scores of the candidates scored
        (library order) and, by id, those left out and why."""
        left_out = left_out or {}
        kept = [i for i in range(len(library.candidates)) if i not in left_out]
        if not kept:
            raise ValueError("every candidate is left out")
        sub = library if not left_out else Library(library.name, library.description,
                                                   tuple(library.candidates[i] for i in kept))
        step = await select_step(self.engine, ctx, sub, [cand_ids[i] for i in kept], alpha=alpha, tau=tau,
                                 seed=rng)
        i, cand = kept[step.selection.index], step.candidate
        turn.reasoning_s = step.latency_s
        turn.candidate_id = cand.id
        turn.left_out = {library.candidates[j].id: why for j, why in sorted(left_out.items())}
        # the label is the number the system prompt lists the whole library under
        shown = self.format.display_order(library).index(i)
        turn.reasoning = self.format.reasoning.label.format(index=shown) if label_only else cand.text
        turn.scores, turn.q = list(step.selection.scores), list(step.selection.q)
        turn.cached_tokens = step.scores[0].cached_tokens
        turn.context_tokens = step.scores[0].context_tokens or turn.context_tokens
        turn.scored_tokens = step.scored_tokens
        turn.reasoning_span = (len(ctx), len(ctx) + len(cand_ids[i]))
        return ctx.extend(cand_ids[i])

    async def think(self, ctx: Context, *, budget: int, temperature: float,
                    rng: np.random.Generator | None, turn: Turn) -> Context:
        """Freeform: decode the reasoning inside the format's reasoning block (closed by us if cut)."""
        with tracing.span("ssr.think") as span:
            ctx = await self._think(ctx, budget=budget, temperature=temperature, rng=rng, turn=turn)
            span.set({"ssr.think.tokens": turn.reasoning_tokens, "ssr.cached_tokens": turn.cached_tokens})
            return ctx

    async def _think(self, ctx: Context, *, budget: int, temperature: float,
                     rng: np.random.Generator | None, turn: Turn) -> Context:
        t0 = time.perf_counter()
        ctx = ctx.extend(self._reasoning_open)
        gen = await self.engine.generate(ctx, GenerationParams(
            max_new_tokens=budget, stop=(self.format.reasoning.close,), temperature=temperature,
            seed=_seed(rng)))
        turn.reasoning_s = time.perf_counter() - t0
        turn.reasoning = gen.text.strip()
        turn.reasoning_tokens = len(gen.token_ids)
        turn.cached_tokens = gen.cached_tokens
        turn.context_tokens = gen.prompt_tokens
        kept = gen.token_ids[:-1] if gen.finish_reason == "eos" else gen.token_ids
        turn.reasoning_span = (len(ctx), len(ctx) + len(kept))
        ctx = ctx.extend(kept)
        if gen.finish_reason != "stop":  # budget spent (or end of sequence): close the block ourselves
            ctx = ctx.extend(self._reasoning_close)
        return ctx

    # ---- action --------------------------------------------------------------------------------
    async def _choose(self, ctx: Context, choices: Sequence[ActionChoice]) -> ActionChoice:
        """The most likely opening among the allowed choices (total log-probability: alpha = 0)."""
        scores = await self.engine.score(ctx, [c.opening for c in choices])
        sel = select([s.logprob_sum for s in scores], [s.num_tokens for s in scores], alpha=0.0, tau=0.0)
        return choices[sel.index]

    async def act(self, ctx: Context, choices: Sequence[ActionChoice], *, temperature: float,
                  rng: np.random.Generator | None, turn: Turn, max_new_tokens: int | None = None,
                  ) -> tuple[Context, Decision]:
        """``_act`` in its ``ssr.action`` span."""
        with tracing.span("ssr.action", {"ssr.action.choices": len(choices)}) as span:
            ctx, decision = await self._act(ctx, choices, temperature=temperature, rng=rng, turn=turn,
                                            max_new_tokens=max_new_tokens)
            span.set({"ssr.action.type": turn.action_type, "ssr.action.tool": turn.tool_name,
                      "ssr.action.tokens": turn.action_tokens, "ssr.action.forwards": turn.action_forwards,
                      "ssr.action.complete": decision.complete, "ssr.action.error": turn.error})
            return ctx, decision

    async def _act(self, ctx: Context, choices: Sequence[ActionChoice], *, temperature: float,
                   rng: np.random.Generator | None, turn: Turn, max_new_tokens: int | None = None,
                   ) -> tuple[Context, Decision]:
        """Force the opening of one allowed choice, decode its part under its grammar, close it; record
        the action on ``turn``. Problems no grammar can rule out become ``turn.error``."""
        t0 = time.perf_counter()
        choice = choices[0] if len(choices) == 1 else await self._choose(ctx, choices)
        budget = choice.max_new_tokens
        if max_new_tokens is not None:
            budget = min(max_new_tokens, budget)
        start = len(ctx)
        ctx = ctx.extend(choice.opening)
        gen = await self.engine.generate(ctx, GenerationParams(
            max_new_tokens=budget, grammar=choice.grammar, temperature=temperature, seed=_seed(rng)))
        complete = gen.finish_reason == "stop"
        kept = gen.token_ids[:-1] if gen.finish_reason == "eos" else gen.token_ids
        turn.action_span = (len(ctx), len(ctx) + len(kept))
        ctx = ctx.extend(kept)
        turn.action_tokens = len(gen.token_ids)
        turn.action_forwards = gen.forwards
        metrics.observe_action(turn.mode, turn.action_tokens, gen.forwards)
        text = gen.text
        if choice.action == "answer":
            # The grammar admits no '<' in the answer: one starts the closing tag, which is whole when
            # the grammar completed, or cut by the budget (then the rest of it is appended).
            close = self.format.actions.answer.close
            cut = text.find(close[0])
            partial, text = (text[cut:], text[:cut]) if cut >= 0 else ("", text)
            if not complete:
                rest = close[len(partial):] if close.startswith(partial) else close
                ctx = ctx.extend(self.chat.encode(rest) if rest != close else self._answer_close)
        else:
            ctx = ctx.extend(choice.closing)
        turn.action_s = time.perf_counter() - t0
        turn.action_type = choice.action
        turn.tool_name = choice.tool_name
        turn.action_text = self.engine.tokenizer.decode(ctx.token_ids[start:], skip_special_tokens=False)
        turn.argument = text.strip()
        if choice.action == "answer":
            return ctx, Decision(choice, None, complete)
        try:
            if not complete:
                raise ActionParseError(f"the arguments were cut at {budget} tokens")
            # strict=False: xgrammar's length-bounded strings (maxLength) admit raw control characters,
            # which strict JSON forbids; they are kept as data and escaped when re-serialised.
            arguments = json.loads(text, strict=False)
            if not isinstance(arguments, dict):
                raise ActionParseError("the arguments are not a JSON object")
            turn.arguments = arguments
            call = choice.spec.to_call(arguments, len(ctx.images)) if choice.spec is not None else None
            return ctx, Decision(choice, call, complete)
        except ValueError as exc:  # JSONDecodeError: impossible under the grammar, kept as a guard
            turn.error = f"the arguments are not valid JSON ({exc.__class__.__name__})"
        except ActionParseError as exc:
            turn.error = exc.message
        return ctx, Decision(choice, None, complete)

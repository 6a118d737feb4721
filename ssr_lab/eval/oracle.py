"""Oracle trajectories: a question's gold moves played through the real agent loop and the real tools.

``OracleEngine`` is an engine whose choices are the gold moves: it scores the gold rationale (or the
gold action's opening) above the others and "generates" the gold arguments, the gold answer, and, in
freeform mode, a paraphrased reasoning paragraph. Everything else is the real thing: the agent loop
renders the prompt format, the tools search the world's corpus and image index, observations and
images enter the context exactly as they would for a model. The final context is therefore a training
example in the served format, token for token with the tokenizer given, and the run record says what
the tools returned (``replay_problems`` checks it holds the evidence the gold answer rests on).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ssr_lab.eval.paraphrase import reasoning
from ssr_lab.world.records import Move, Question
from ssr_server.agent.loop import Agent, RunOptions
from ssr_server.agent.trace import Run
from ssr_server.core.actions import ALL_ACTIONS
from ssr_server.core.answers import is_correct
from ssr_server.core.errors import EngineError
from ssr_server.core.formats.format import PromptFormat
from ssr_server.core.library import Library
from ssr_server.core.protocol import CandidateScore, Context, Generation, GenerationParams, ImageRef

_LOSER_LOGPROB = -20.0


class OracleEngine:
    """An Engine protocol implementation that plays one question's gold moves."""

    def __init__(self, tokenizer: Any, fmt: PromptFormat, library: Library, question: Question,
                 *, paraphrase_seed: int = 0) -> None:
        self._tok = tokenizer
        self._format = fmt
        self._question = question
        self._library = library
        self._turn = 0
        self._seed = paraphrase_seed
        self._openings: dict[str, tuple[int, ...]] = {
            a: tuple(self._tok.encode(fmt.action_opening(a), add_special_tokens=False)) for a in ALL_ACTIONS}

    @property
    def name(self) -> str:
        return "oracle"

    @property
    def tokenizer(self) -> Any:
        return self._tok

    @property
    def move(self) -> Move:
        if self._turn >= len(self._question.moves):
            raise EngineError(f"question {self._question.id}: the run went past its gold moves")
        return self._question.moves[self._turn]

    async def score(self, context: Context, candidates: Sequence[Sequence[int]]) -> list[CandidateScore]:
        cands = [tuple(c) for c in candidates]
        if len(cands) == len(self._library.candidates) and not set(cands) <= set(self._openings.values()):
            target = self._gold_candidate()
        else:  # the choice among action openings
            opening = self._openings[self.move.action]
            if opening not in cands:
                raise EngineError(f"the gold action {self.move.action} is not among the allowed ones")
            target = cands.index(opening)
        return [CandidateScore(tuple(0.0 if i == target else _LOSER_LOGPROB for _ in c),
                               context_tokens=len(context)) for i, c in enumerate(cands)]

    def _gold_candidate(self) -> int:
        """The gold move's rationale, or, in a library without it (the ablations), the first rationale
        that allows the gold action."""
        move = self.move
        if move.move in self._library.ids:
            return self._library.ids.index(move.move)
        for i, c in enumerate(self._library.candidates):
            if move.action in c.allowed_actions:
                return i
        raise EngineError(f"library {self._library.name} has no rationale allowing {move.action}")

    async def generate(self, context: Context, params: GenerationParams) -> Generation:
        move = self.move
        if params.grammar is None:  # freeform reasoning, up to the reasoning block's closing tag
            text = reasoning(self._question, self._turn, self._seed)
            close = self._format.reasoning.close
            return self._generation(context, text + close, text, close)
        if params.grammar.kind == "json_schema":
            text = json.dumps(_arguments(move), ensure_ascii=False)
        else:  # the answer, which its grammar ends with the closing tag
            text = move.answer + self._format.actions.answer.close
        self._turn += 1
        return self._generation(context, text, text, None)

    def _generation(self, context: Context, full: str, text: str, stop: str | None) -> Generation:
        ids = tuple(self._tok.encode(full, add_special_tokens=False))
        return Generation(token_ids=ids, text=text, finish_reason="stop", prompt_tokens=len(context),
                          cached_tokens=0, elapsed_s=0.0, stop_text=stop)

    async def ready(self) -> bool:
        return True

    async def close(self) -> None:
        return None


def _arguments(move: Move) -> dict[str, Any]:
    if move.action == "text_search":
        return {"query": move.query}
    if move.action == "zoom":
        return {"bbox_2d": list(move.box), "label": move.label, "img_idx": move.image_index}
    return {}


async def oracle_run(agent: Agent, question: Question, image: ImageRef, mode: str = "ssr",
                     library: Library | None = None, paraphrase_seed: int = 0,
                     label_only: bool = False) -> tuple[Run, Context]:
    """Play ``question``'s gold moves through ``agent``'s loop and tools (its engine is replaced by the
    oracle for this run); returns the run and the final context."""
    lib = library or agent.libraries.get("default")
    oracle = OracleEngine(agent.engine.tokenizer, agent.format, lib, question,
                          paraphrase_seed=paraphrase_seed)
    player = Agent(oracle, agent.tools, agent.libraries, agent.format)
    options = RunOptions(mode=mode, library=lib.name, max_turns=len(question.moves), max_errors=1,
                         label_only=label_only)
    return await player.run_with_context(question.question, [image], options)


def replay_problems(question: Question, run: Run) -> list[str]:
    """Why a replayed oracle run does not reach its gold answer on real evidence (empty: it does)."""
    problems: list[str] = []
    if run.outcome != "answered" or not is_correct(run.answer or "", question.answer, question.aliases):
        problems.append(f"outcome {run.outcome}, answer {run.answer!r} (gold {question.answer!r})")
    for move, turn in zip(question.moves, run.turns, strict=False):
        if turn.error is not None:
            problems.append(f"turn {turn.index} ({move.move}) failed: {turn.error}")
        elif move.action == "image_search" and move.expect_title not in turn.observation:
            problems.append(f"turn {turn.index}: image search did not list {move.expect_title!r}")
        elif move.action == "text_search" and move.expect_text and move.expect_text not in turn.observation:
            problems.append(f"turn {turn.index}: text search did not return the document {move.expect_url}")
        elif move.action == "zoom" and not turn.observation.startswith("Zoomed image"):
            problems.append(f"turn {turn.index}: zoom gave no image")
    if len(run.turns) != len(question.moves):
        problems.append(f"{len(run.turns)} turns for {len(question.moves)} gold moves")
    return problems

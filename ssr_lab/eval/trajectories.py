"""Oracle trajectories for a split of a world: played with a given tokenizer, checked, and written out.

Training builds them in memory with its own tokenizer (``oracle_trajectories``); ``ssr-lab world
trajectories`` writes the same ones as text (JSONL: the question's record, the run, the context text)
for inspection and for other trainers.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from ssr_lab.eval.oracle import oracle_run, replay_problems
from ssr_lab.eval.runner import select_questions
from ssr_lab.world.records import Question
from ssr_server.agent.loop import Agent
from ssr_server.agent.trace import Run
from ssr_server.core.config import Settings
from ssr_server.core.formats.format import PromptFormat, get_format
from ssr_server.core.library import Library, LibraryRegistry
from ssr_server.core.protocol import Context, ImageRef
from ssr_server.tools.registry import ToolRegistry, build_registry


@dataclass(frozen=True)
class Trajectory:
    question: Question
    run: Run
    context: Context
    problems: tuple[str, ...]  # empty: the replay reached the gold answer on real evidence


class _TokenizerOnly:
    """The one part of an engine the oracle's agent needs before the oracle takes over."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.name = "tokenizer-only"


def world_tools(world: Path) -> ToolRegistry:
    return build_registry(corpus_path=world / "corpus.jsonl", image_index_dir=world / "images")


def question_image(world: Path, question: Question) -> ImageRef:
    with Image.open(world / question.image) as img:
        return ImageRef.from_pil(img.convert("RGB"))


async def oracle_trajectories(world: Path, questions: Sequence[Question], tokenizer: Any, *,
                              mode: str = "ssr", library: Library | None = None,
                              fmt: PromptFormat | None = None, tools: ToolRegistry | None = None,
                              paraphrase_seed: int = 0, label_only: bool = False,
                              ) -> AsyncIterator[Trajectory]:
    """Each question's oracle run, in order (tools over ``world`` unless given)."""
    own = tools is None
    registry = tools or world_tools(world)
    agent = Agent(_TokenizerOnly(tokenizer), registry, LibraryRegistry(), fmt or get_format())  # type: ignore[arg-type]
    try:
        for q in questions:
            run, ctx = await oracle_run(agent, q, question_image(world, q), mode, library, paraphrase_seed,
                                        label_only)
            yield Trajectory(q, run, ctx, tuple(replay_problems(q, run)))
    finally:
        if own:
            await registry.aclose()


async def write_trajectories(world: Path, out: Path, *, mode: str, split: str, limit: int | None,
                             settings: Settings) -> tuple[int, int]:
    """Write the split's oracle trajectories as JSONL text; returns (written, with problems)."""
    from transformers import AutoTokenizer

    from ssr_server.engine.factory import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(settings))
    questions = select_questions(world, split, limit)
    n = bad = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        async for t in oracle_trajectories(world, questions, tokenizer, mode=mode):
            record = {"question": t.question.to_json(), "mode": mode, "problems": list(t.problems),
                      "run": t.run.to_dict(), "context_tokens": len(t.context),
                      "context_text": tokenizer.decode(list(t.context.token_ids), skip_special_tokens=False)}
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            n += 1
            bad += bool(t.problems)
    return n, bad

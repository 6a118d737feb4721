"""What a training run starts from: the model (a fresh shape or a checkpoint) and its training data.

A fresh model gets a byte-level BPE learned on the world's own text (corpus, questions, the prompt
format, the reasoning paraphrases): a small model then spends its parameters on the task rather than on
a 151k-entry embedding, and sequences stay short. Its examples are the split's oracle trajectories,
played through the real loop and tools with that very tokenizer, so training sees exactly the tokens the
server will build.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from ssr_server.eval.paraphrase import reasoning
from ssr_server.eval.trajectories import oracle_trajectories
from ssr_server.formats.format import PromptFormat
from ssr_server.library import Library
from ssr_server.train.data import Example, make_example
from ssr_server.world.records import Question


def world_texts(world: Path, questions: Sequence[Question], fmt: PromptFormat,
                library: Library) -> Iterable[str]:
    """The text a model of this world reads and writes (for learning its tokenizer)."""
    system = fmt.system_prompt(library)
    yield from [system] * 50  # frequent: its words become whole tokens
    for c in library.candidates:
        yield from [fmt.reasoning.candidate.format(text=c.text)] * 20
    with (world / "corpus.jsonl").open(encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)
            yield f"{doc['title']}\n{doc.get('url', '')}\n{doc['text']}"
    for q in questions:
        yield q.question
        for i, m in enumerate(q.moves):
            yield reasoning(q, i)
            if m.action == "answer":
                yield fmt.actions.answer.open + m.answer + fmt.actions.answer.close
            elif m.action == "text_search":
                yield fmt.tool_call_text("text_search", {"query": m.query})
            elif m.action == "zoom":
                args = {"bbox_2d": m.box, "label": m.label, "img_idx": m.image_index}
                yield fmt.tool_call_text("zoom", args)
    for template in fmt.observations.model_dump().values():
        yield str(template)


def new_model(shape_spec: str, world: Path, questions: Sequence[Question], fmt: PromptFormat,
              library: Library, seed: int) -> tuple[Any, Any]:
    """A fresh Qwen3-VL of ``shape_spec`` (``HxL``) with a tokenizer learned on the world's text."""
    from transformers import Qwen3VLForConditionalGeneration

    from ssr_server.engine.tiny import TinyShape, build_tokenizer, make_config

    shape = TinyShape.parse(shape_spec)
    tok: Any = build_tokenizer("trained", shape, corpus=world_texts(world, questions, fmt, library))
    torch.manual_seed(seed)
    return Qwen3VLForConditionalGeneration(make_config(tok, shape)), tok


def load_model(path: str | Path) -> tuple[Any, Any]:
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
    return model, AutoTokenizer.from_pretrained(path)


async def oracle_examples(world: Path, questions: Sequence[Question], tokenizer: Any, fmt: PromptFormat,
                          library: Library, mode: str, *, paraphrase_seeds: Sequence[int] = (0,),
                          label_only: bool = False, progress: bool = True) -> tuple[list[Example], int]:
    """Training examples of ``questions`` in ``mode`` (one per paraphrase seed in freeform mode);
    returns them and the number of trajectories dropped because their replay failed."""
    from tqdm import tqdm

    open_ids = tokenizer.encode(fmt.assistant_start(), add_special_tokens=False)
    close_id = tokenizer.convert_tokens_to_ids(fmt.chat.close.strip())
    seeds = paraphrase_seeds if mode == "freeform" else (0,)
    out: list[Example] = []
    dropped = 0
    bar = tqdm(total=len(questions) * len(seeds), desc=f"oracle {mode}", unit="traj", disable=not progress)
    for seed in seeds:
        async for t in oracle_trajectories(world, questions, tokenizer, mode=mode, library=library, fmt=fmt,
                                           paraphrase_seed=seed, label_only=label_only):
            bar.update(1)
            if t.problems:
                dropped += 1
                continue
            out.append(make_example(f"{t.question.id}/{mode}/{seed}", t.question.kind, t.context, open_ids,
                                    close_id))
    bar.close()
    return out, dropped


def split_questions(questions: Sequence[Question], split: str, limit: int | None,
                    seed: int) -> list[Question]:
    chosen = [q for q in questions if q.split == split]
    if limit is not None and limit < len(chosen):
        chosen = random.Random(seed).sample(chosen, limit)
    return chosen

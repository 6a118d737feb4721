"""What a training run starts from: the model (a fresh shape or a checkpoint) and its training data.

A fresh model gets a byte-level BPE learned on the world's own text (corpus, questions, the prompt
format, the reasoning paraphrases): a small model then spends its parameters on the task rather than on
a 151k-entry embedding, and sequences stay short. Its pre-tokeniser keeps words apart from the space or
punctuation before them (``tiny.WORDS_PATTERN``), so that a name found in a search result is the same
tokens in the query or the answer that copies it, and copying can be plain induction (Qwen's pattern
glues the leading quote or space to the word; the price is 33% more tokens). It is necessary, not
sufficient: our 30-minute models still do not copy (README, Training).
Its examples are the split's oracle trajectories, played through the real loop and tools with that very
tokenizer, so training sees exactly the tokens the server will build.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import random
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ssr_lab.eval.paraphrase import reasoning
from ssr_lab.eval.trajectories import oracle_trajectories
from ssr_lab.train.data import Example, make_example
from ssr_lab.train.look_search import searched
from ssr_lab.world.records import Move, Question
from ssr_lab.world.views import check_zoom_style, coarse_boxes, styled_box
from ssr_server.core.formats.format import PromptFormat
from ssr_server.core.library import Library
from ssr_server.core.progress import progress_bar


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


PHRASE_MIN_CHARS = 20  # shorter lines ("# Tools", "<tools>") stay ordinary text


def prompt_phrases(fmt: PromptFormat, libraries: Iterable[Library]) -> list[str]:
    """The lines of the system prompt (one per library) that a fresh tokenizer holds as single tokens.

    The prompt is a constant ~1,700-token preamble of every context (the harness's instructions, the
    strategy list, the tool signatures); a tiny model needs it as a fixed marker, not word by word. As
    ~35 line tokens it costs little in training (forward + backward of 16 search trajectories on a
    fresh 128x4: 3.35 s without, 1.76 s with the phrases, 2 threads) and in every scoring pass; the text
    is unchanged, so any other tokenizer (a real Qwen checkpoint's) reads the same prompt as before."""
    lines: list[str] = []
    for library in libraries:
        lines += [ln for ln in fmt.system_prompt(library).split("\n") if len(ln) >= PHRASE_MIN_CHARS]
    return list(dict.fromkeys(lines))


def new_model(shape_spec: str, world: Path, questions: Sequence[Question], fmt: PromptFormat,
              library: Library, seed: int, phrases: bool = True) -> tuple[Any, Any]:
    """A fresh Qwen3-VL of ``shape_spec`` (``HxL``) with a tokenizer learned on the world's text
    (with ``phrases``, the system prompt's lines of every shipped library as single tokens)."""
    from transformers import Qwen3VLForConditionalGeneration

    from ssr_server.core.library import LibraryRegistry
    from ssr_server.engine.tiny import TinyShape, build_tokenizer, make_config

    shape = TinyShape.parse(shape_spec)
    registry = LibraryRegistry()
    libraries = [library, *(registry.get(n) for n in registry.names() if n != library.name)]
    tok: Any = build_tokenizer("trained", shape, corpus=world_texts(world, questions, fmt, library),
                               words_apart=True, phrases=prompt_phrases(fmt, libraries) if phrases else ())
    torch.manual_seed(seed)
    return Qwen3VLForConditionalGeneration(make_config(tok, shape)), tok


def load_model(path: str | Path) -> tuple[Any, Any]:
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
    return model, AutoTokenizer.from_pretrained(path)


def trainable(model: Any, freeze_vision: bool) -> list[torch.nn.Parameter]:
    """The parameters an optimizer gets; a frozen vision tower (and its deepstack mergers) keeps what
    `train vision` taught it while the language model learns to use it."""
    if freeze_vision:
        model.model.visual.requires_grad_(False)
    return [p for p in model.parameters() if p.requires_grad]


def param_groups(model: Any, trained: Sequence[torch.nn.Parameter],
                 vision_lr_scale: float = 1.0) -> list[dict[str, Any]]:
    """``trained`` as optimizer groups, each with the ``scale`` of the run's learning rate it takes: the
    vision tower's (and its deepstack mergers') ``vision_lr_scale``, the rest 1. A tower trained with the
    language model at a fraction of its rate learns what the answers need to see without moving the
    tokens the language model already reads as fast as its own weights move."""
    if vision_lr_scale == 1.0:  # one group, as before the option: older checkpoints' optimizers resume
        return [{"params": list(trained), "scale": 1.0}]
    tower = {id(p) for p in model.model.visual.parameters()}
    groups = [{"params": [p for p in trained if id(p) not in tower], "scale": 1.0},
              {"params": [p for p in trained if id(p) in tower], "scale": vision_lr_scale}]
    return [g for g in groups if g["params"]]


async def oracle_examples(world: Path, questions: Sequence[Question], tokenizer: Any, fmt: PromptFormat,
                          library: Library, mode: str, *, paraphrase_seeds: Sequence[int] = (0,),
                          label_only: bool = False, progress: bool = True,
                          cache: bool = False) -> tuple[list[Example], int]:
    """Training examples of ``questions`` in ``mode`` (one per paraphrase seed in freeform mode);
    returns them and the number of trajectories dropped because their replay failed. With ``cache``,
    they are kept under ``world/.cache/`` keyed by everything they depend on (world manifest, questions,
    tokenizer, format, library, mode, seeds): replaying 18,500 trajectories costs ~5 minutes here."""
    seeds = paraphrase_seeds if mode == "freeform" else (0,)
    path = _cache_path(world, questions, tokenizer, fmt, library, mode, seeds, label_only) if cache else None
    if path is not None and path.is_file():
        with path.open("rb") as f:
            cached: tuple[list[Example], int] = pickle.load(f)
        return cached
    out, dropped = await _replay(world, questions, tokenizer, fmt, library, mode, seeds, label_only, progress)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        with tmp.open("wb") as f:
            pickle.dump((out, dropped), f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
    return out, dropped


def _cache_path(world: Path, questions: Sequence[Question], tokenizer: Any, fmt: PromptFormat,
                library: Library, mode: str, seeds: Sequence[int], label_only: bool) -> Path:
    h = hashlib.sha256()
    manifest = world / "manifest.json"
    h.update(manifest.read_bytes() if manifest.is_file() else str(world.resolve()).encode())
    h.update("\n".join(q.id for q in questions).encode())
    # a zoom into a crop (image_index > 0) keys too; the old keys, all on image 0, stay as they were
    h.update(json.dumps([[m.box, m.image_index] if m.image_index else m.box
                         for q in questions for m in q.moves if m.action == "zoom"]).encode())
    searching = [[q.id, [m.to_json() for m in q.moves]] for q in questions if searched(q)]
    if searching:  # visual questions answered by a search; the old keys (none) stay as they were
        h.update(json.dumps(["searched", searching]).encode())
    h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    h.update(json.dumps([fmt.name, fmt.system_prompt(library), list(fmt.candidate_surfaces(library)),
                         mode, list(seeds), label_only]).encode())
    return world / ".cache" / f"examples-{mode}-{h.hexdigest()[:20]}.pkl"


async def _replay(world: Path, questions: Sequence[Question], tokenizer: Any, fmt: PromptFormat,
                  library: Library, mode: str, seeds: Sequence[int], label_only: bool,
                  progress: bool) -> tuple[list[Example], int]:
    open_ids = tokenizer.encode(fmt.assistant_start(), add_special_tokens=False)
    close_id = tokenizer.convert_tokens_to_ids(fmt.chat.close.strip())
    out: list[Example] = []
    dropped = 0
    bar = progress_bar(total=len(questions) * len(seeds), desc=f"oracle {mode}", unit="traj",
                       disable=not progress)
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


def zoom_styled(questions: Sequence[Question], style: str) -> list[Question]:
    """``questions`` with every zoom move's box in the zoom ``style`` (``views.styled_box``): what the
    oracle trajectories and picture drills then write. "coarse" makes each zoom on the question image two
    calls (``views.coarse_boxes``): the strip, then the wide box on the strip's crop (the next image).
    The world's gold boxes stay as built."""
    check_zoom_style(style)  # also where no question zooms
    return [replace(q, moves=[s for m in q.moves for s in _styled(m, style)])
            if any(m.action == "zoom" for m in q.moves) else q for q in questions]


def _styled(move: Move, style: str) -> list[Move]:
    if move.action != "zoom":
        return [move]
    if style != "coarse" or move.image_index != 0:
        return [replace(move, box=list(styled_box(move.box, style)))]
    strip, inner = coarse_boxes(move.box)
    # the strip's crop is image 1 of the run: the question has one image, the zoom tool numbers from 0
    return [replace(move, box=list(strip)), replace(move, box=list(inner), image_index=1)]


def split_questions(questions: Sequence[Question], split: str, limit: int | None,
                    seed: int) -> list[Question]:
    chosen = [q for q in questions if q.split == split]
    if limit is not None and limit < len(chosen):
        chosen = random.Random(seed).sample(chosen, limit)
    return chosen

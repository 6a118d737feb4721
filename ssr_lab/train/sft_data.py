"""``train sft``, step 1 - the data: the questions as the recipe shapes them, the model to start from, and
their oracle trajectories.

Apart from the rest because it is the slow, cached, schedule-free part: the trajectories are replayed
through the agent loop once per world and recipe (or read from ``WORLD/.cache``), and everything after it
only draws from what it returns. The model is built here too because a fresh one learns its tokenizer on
these very questions.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ssr_lab.train.config.sft import SFTConfig
from ssr_lab.train.data import Example
from ssr_lab.train.grow import grow_language_model
from ssr_lab.train.look_search import search_counts
from ssr_lab.train.look_zoom import zoom_looks
from ssr_lab.train.setup import load_model, new_model, oracle_examples, split_questions, zoom_styled
from ssr_lab.world.build import world_entities
from ssr_lab.world.records import Question, load_questions
from ssr_server.core.formats.format import PromptFormat, get_format
from ssr_server.core.library import Library, LibraryRegistry
from ssr_server.engine.tiny import DEFAULT_PIXELS, Pixels, read_pixels


@dataclass(frozen=True)
class SFTData:
    questions: list[Question]  # the training split, in the moves the recipe trains (zoom, looks, searches)
    model: Any
    tok: Any
    fmt: PromptFormat
    library: Library
    pixels: Pixels  # the picture size the model sees; the trained model keeps it
    examples: list[Example]  # one per trajectory (per paraphrase in the freeform form)
    dropped: int  # trajectories the replay could not reproduce


def shaped_questions(cfg: SFTConfig) -> list[Question]:
    """The training questions with the moves the recipe asks for: the zoom box's style, zooming on the
    sign or the motif before answering, count questions searched instead of read."""
    questions = zoom_styled(split_questions(load_questions(cfg.world / "questions.jsonl"), "train", cfg.limit,
                                            cfg.seed), cfg.zoom)
    targets = [t for t, on in (("sign", cfg.zoom_sign), ("motif", cfg.zoom_count)) if on]
    if targets:
        questions = zoom_looks(cfg.world, questions, world_entities(cfg.world), targets, cfg.zoom,
                               cfg.zoom_sign_on)
    if cfg.search_count:
        questions = search_counts(questions, world_entities(cfg.world))
    return questions


def load_data(cfg: SFTConfig, progress: bool = True) -> SFTData:
    """The questions, the starting model (grown before any optimizer or resume sees it, so that a checkpoint
    of this run is the grown model) and the replayed trajectories."""
    fmt = get_format()
    library = LibraryRegistry().get(cfg.library)
    questions = shaped_questions(cfg)
    pixels = DEFAULT_PIXELS
    if Path(cfg.init).is_dir():
        model, tok = load_model(cfg.init)
        pixels = read_pixels(cfg.init)  # the tower learnt to see pictures at this size: keep it
    else:
        model, tok = new_model(cfg.init, cfg.world, questions, fmt, library, cfg.seed)
    if cfg.grow_layers:
        grow_language_model(model, cfg.grow_layers)
    examples, dropped = asyncio.run(oracle_examples(
        cfg.world, questions, tok, fmt, library, cfg.format, paraphrase_seeds=tuple(range(cfg.paraphrases)),
        progress=progress, label_only=cfg.label_only, cache=cfg.cache_examples))
    if not examples:
        raise ValueError(f"no training examples in {cfg.world} (split train)")
    return SFTData(questions, model, tok, fmt, library, pixels, examples, dropped)

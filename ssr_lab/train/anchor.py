"""An SFT anchor for RL (InstructGPT's PPO-ptx): the oracle trajectories' cross-entropy, added to the
policy loss at every optimizer step.

GRPO learns only from groups whose rollouts disagree. A question kind the model already solves gives
groups that all succeed, so nothing in the update speaks for it, and the shared language model drifts
away from it: RL on the failing kinds alone took the shipped model's search questions from 92.5% to 55%
in 47 iterations (README, fourteenth session). The anchor keeps every kind's oracle behaviour in the
gradient while the rollouts teach the failing ones.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ssr_lab.train.data import Collator, Example, token_logits
from ssr_lab.train.rename import Renamer
from ssr_lab.train.rephrase import Rephraser
from ssr_lab.train.setup import oracle_examples, zoom_styled
from ssr_lab.world.records import Question
from ssr_server.core.formats.format import PromptFormat
from ssr_server.core.library import Library


@dataclass(frozen=True)
class SFTAnchor:
    examples: tuple[Example, ...]
    weight: float
    batch_size: int
    renamer: Renamer | None = None  # the augmentations the model was trained with: without them the
    rephraser: Rephraser | None = None  # anchor holds the training phrasings and names only

    @classmethod
    def of(cls, world: Path, questions: Sequence[Question], tokenizer: Any, fmt: PromptFormat,
           library: Library, mode: str, zoom: str, weight: float, batch_size: int, rename: bool = False,
           rephrase: float = 0.0) -> SFTAnchor:
        """The oracle trajectories of ``questions`` (boxes in the ``zoom`` style the model was trained
        on), from the example cache ``train sft`` keeps when it already holds them."""
        styled = zoom_styled(questions, zoom)
        examples, _ = asyncio.run(oracle_examples(world, styled, tokenizer, fmt, library, mode,
                                                  progress=False, cache=True))
        if not examples:
            raise ValueError("the SFT anchor has no oracle trajectory to draw")
        return cls(tuple(examples), weight, batch_size, Renamer(tokenizer, styled) if rename else None,
                   Rephraser(tokenizer, styled, rephrase) if rephrase else None)

    def loss(self, model: Any, collate: Collator, rng: random.Random) -> tuple[torch.Tensor, int]:
        """weight x the mean cross-entropy over the assistant tokens of ``batch_size`` drawn trajectories;
        the number of predicted tokens."""
        drawn = rng.sample(self.examples, min(self.batch_size, len(self.examples)))
        if self.rephraser is not None:  # before renaming, as in `train sft`: it finds the question as written
            drawn = self.rephraser(drawn, rng)
        if self.renamer is not None:
            drawn = self.renamer(drawn, rng)
        batch = collate(drawn)
        ce = torch.nn.functional.cross_entropy(token_logits(model, batch), batch.targets)
        return self.weight * ce, batch.predicted

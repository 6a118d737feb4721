"""``train sft``, step 3 - the schedule: every step's batch, planned before the first step.

Planned up front from one RNG seeded by the run's seed, so that a resumed run replays exactly the batches
the interrupted one would have drawn, and so that the figures can say how many copying and picture steps a
run holds before it starts. An entry is a batch of trajectories (or drills), or a marker for a batch drawn
at its step: the synthetic copying task (``COPY``) or picture drills (``PICTURES``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from ssr_lab.train.config.sft import SFTConfig
from ssr_lab.train.data import Example, batches
from ssr_lab.train.drills import Drills

COPY, PICTURES = "copy", "pictures"  # schedule entries that are not a batch of trajectories
Planned = list[Example] | str


def repeated(examples: Sequence[Example], repeat: Sequence[tuple[str, int]]) -> list[Example]:
    """The epoch's pool: each example as many times as its kind's repeat (once by default)."""
    times = dict(repeat)
    return [e for e in examples for _ in range(times.get(e.kind, 1))]


@dataclass(frozen=True)
class Schedule:
    order: list[Planned]  # at least cfg.steps entries (the last epoch is planned whole)
    epochs: int  # epochs of the pool planned

    def count(self, marker: str, steps: int) -> int:
        return sum(entry == marker for entry in self.order[:steps])


def plan(cfg: SFTConfig, pool: Sequence[Example], drills: Drills | None) -> Schedule:
    """The copying warm-up, then epochs of shuffled pool batches (drills interleaved), with a picture
    batch after every ``pictures_every - 1`` of them and a copying batch after every ``copy_every - 1``;
    ``pictures_every: 1`` is a reading phase, picture drills only."""
    rng = random.Random(cfg.seed)
    order: list[Planned] = [COPY] * cfg.copy_warmup
    epoch = regular = 0
    if cfg.pictures_every == 1:
        order += [PICTURES] * max(0, cfg.steps - len(order))
    while len(order) < cfg.steps:
        epoch_batches = batches(pool, cfg.batch_size, rng)
        for batch in (drills.interleave(epoch_batches, cfg.batch_size, rng, cfg.drill_sizes) if drills
                      else epoch_batches):
            order.append(batch)
            regular += 1
            if cfg.pictures_every > 1 and regular % (cfg.pictures_every - 1) == 0:
                order.append(PICTURES)
            if cfg.copy_every > 1 and regular % (cfg.copy_every - 1) == 0:
                order.append(COPY)
        epoch += 1
    return Schedule(order, epoch)

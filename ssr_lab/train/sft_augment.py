"""``train sft``, step 2 - the augmentations: what a drawn batch becomes, and the batches added to them.

Renaming (copy the name, do not remember it) and rephrasing (other words, same moves) change a trajectory
batch when it is drawn; copying drills (the query, the answer), their two-hop contrast twins and picture
drills (a freshly drawn picture for a visual or detail trajectory) are batches of their own. Every draw
at a step has its own RNG seeded by the run's seed and the step, with an offset per augmentation: a resumed
run draws the same names, phrasings and pictures, and turning one augmentation on leaves the others' draws
where they were.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ssr_lab.train.config.sft import SFTConfig
from ssr_lab.train.contrast import contrast_drills
from ssr_lab.train.data import Example
from ssr_lab.train.drills import Drills, DrillTokens
from ssr_lab.train.picture_drills import PictureDrills
from ssr_lab.train.rename import Renamer
from ssr_lab.train.rephrase import Rephraser
from ssr_lab.train.sft_data import SFTData
from ssr_lab.world.build import world_entities

STEP_SEED = 1_000_003  # a step's draws are seeded seed * STEP_SEED + step (+ the augmentation's offset)


def step_rng(seed: int, step: int, offset: int = 0) -> random.Random:
    return random.Random(seed * STEP_SEED + step + offset)


@dataclass(frozen=True)
class Augmentations:
    renamer: Renamer | None
    rephraser: Rephraser | None
    rephrase_pictures: bool  # the rephraser also rewrites picture drills' questions
    drills: Drills | None  # answer and query drills, interleaved into the schedule
    contrasts: int  # query drills added by the two-hop contrast
    pictures: PictureDrills | None
    pictures_batch: int
    seed: int

    @classmethod
    def of(cls, cfg: SFTConfig, data: SFTData, pool: list[Example]) -> Augmentations:
        """The recipe's augmentations over ``data``; drills come from ``pool`` (the repeat-weighted
        trajectories) with ``drills_repeat``, else from each trajectory once."""
        tok, questions = data.tok, data.questions
        renamer = Renamer(tok, questions) if cfg.rename else None
        rephraser = (Rephraser(tok, questions, cfg.rephrase, cfg.rephrase_pictures, cfg.rephrase_refs,
                               cfg.rephrase_openings) if cfg.rephrase else None)
        drills = (Drills.of(pool if cfg.drills_repeat else data.examples, DrillTokens.of(tok, data.fmt),
                            every_call=cfg.drill_calls == "all") if cfg.drills else None)
        contrasts = 0
        if drills is not None and cfg.drill_contrast:  # its own RNG: the schedule's draws stay as they were
            flips = contrast_drills(drills.queries, questions, tok, random.Random(cfg.seed + 0xC0))
            drills = Drills(drills.answers, drills.queries + flips)
            contrasts = len(flips)
        pictures = (PictureDrills.of(data.examples, questions, world_entities(cfg.world), tok, data.fmt,
                                     moves=cfg.picture_moves, zoom=cfg.zoom, zoom_jitter=cfg.zoom_jitter,
                                     zoom_edge_jitter=cfg.zoom_edge_jitter, zoom_retry=cfg.zoom_retry)
                    if cfg.pictures_every else None)
        if pictures is not None and not pictures.sources:
            raise ValueError("pictures_every: no visual or detail trajectory to draw pictures for")
        return cls(renamer, rephraser, cfg.rephrase_pictures, drills, contrasts, pictures, cfg.pictures_batch,
                   cfg.seed)

    def trajectories(self, batch: list[Example], step: int) -> list[Example]:
        """A planned batch of trajectories (or drills) as drawn at ``step``: rephrased, then renamed."""
        if self.rephraser is not None:  # before renaming: it finds the question as written
            batch = self.rephraser(batch, step_rng(self.seed, step, 0x5EED))
        if self.renamer is not None:
            batch = self.renamer(batch, step_rng(self.seed, step))
        return batch

    def picture_batch(self, step: int) -> list[Example]:
        """The picture drills of a picture step (the schedule holds one only with picture drills on)."""
        assert self.pictures is not None
        drawn = self.pictures.draw(self.pictures_batch, step_rng(self.seed, step))
        if self.rephraser is not None and self.rephrase_pictures:  # its own RNG: the drills stay
            drawn = self.rephraser(drawn, step_rng(self.seed, step, 0x91C))
        return drawn


"""``ssr-lab train sft``'s recipe: every field of a supervised run, and the combinations it refuses."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import Field, model_validator
from pydantic.dataclasses import dataclass

from ssr_lab.train.config.fields import RECIPE, IntPair, KindRepeats, Names, Share, Text, ZoomStyle, one_of
from ssr_lab.train.look_zoom import SIGN_ATTRIBUTES


def _jitter(what: str) -> str:
    return (f"{what} move sideways by a random amount up to this many gold-box widths (0: centred), as a "
            "model's imprecise zoom box makes them")


@dataclass(frozen=True, config=RECIPE)
class SFTConfig:
    """Supervised training on a world's oracle trajectories (loss on assistant tokens only)."""

    world: Annotated[Path, Field(description="a `world build` folder")]
    out: Annotated[Path, Field(description="where the model goes (resumes from its checkpoints)")]
    format: Annotated[Literal["ssr", "freeform"], Field(description="the trajectories' form")] = "ssr"
    init: Annotated[Text, Field(description="a shape HxL (a fresh model, the world's tokenizer) or a model "
                                            "folder")] = "256x4"
    library: Annotated[str, Field(description="the rationale library (ssr form)")] = "default"
    label_only: Annotated[bool, Field(description="train on index labels instead of texts (ssr form)")
                          ] = False
    steps: Annotated[int, Field(ge=1, description="optimizer steps planned")] = 1500
    batch_size: Annotated[int, Field(ge=1, description="trajectories per batch")] = 16
    lr: Annotated[float, Field(gt=0.0, description="peak learning rate")] = 1e-3
    min_lr_ratio: Annotated[Share, Field(description="the cosine decay's floor, as a share of lr")] = 0.1
    warmup: Annotated[int, Field(ge=0, description="steps of linear warm-up")] = 100
    weight_decay: Annotated[float, Field(ge=0.0, description="AdamW weight decay")] = 0.01
    clip: Annotated[float, Field(gt=0.0, description="gradient norm clip")] = 1.0
    seed: Annotated[int, Field(description="seeds the schedule, the draws and a fresh model")] = 0
    limit: Annotated[int | None, Field(description="at most this many training questions (null: all)")] = None
    paraphrases: Annotated[int, Field(ge=1, description="freeform: reasoning paraphrases per question")] = 2
    max_minutes: Annotated[float, Field(description="wall-clock budget: saves and stops past it")] = 28.0
    anneal_by_time: Annotated[bool, Field(description=(
        "the learning rate also decays with the share of max_minutes spent, so that a run the budget cuts "
        "short still ends annealed (not deterministic)"))] = False
    save_every: Annotated[int, Field(ge=1, description="steps between resumable checkpoints")] = 250
    log_every: Annotated[int, Field(ge=1, description="steps between train_log.jsonl lines")] = 10
    threads: Annotated[int | None, Field(description="torch threads (null: all cores)")] = None
    cache_examples: Annotated[bool, Field(description=(
        "keep the replayed trajectories under WORLD/.cache (5 minutes per 18k to replay)"))] = True
    rename: Annotated[bool, Field(description=(
        "a fresh invented name for the entity each time an example is drawn: copy, not remember "
        "(rename.py)"))] = False
    drills: Annotated[bool, Field(description="interleave short copying drills: query, answer (drills.py)")
                      ] = False
    drill_sizes: Annotated[IntPair, Field(description=(
        "[answer, query] drill batches, in multiples of batch_size"))] = (2, 4)
    drill_calls: Annotated[Literal["first", "all"], Field(description=(
        "query drills of each trajectory's first text search, or of all (two-hop: the second hop "
        "too)"))] = "first"
    drills_repeat: Annotated[bool, Field(description=(
        "drills drawn from the repeat-weighted pool (else each trajectory once)"))] = False
    rephrase: Annotated[Share, Field(description=(
        "share of drawn fact and two-hop questions asked in other words (rephrase.py)"))] = 0.0
    rephrase_pictures: Annotated[bool, Field(description=(
        "rephrase also the visual and detail questions (frames the sign and the plaque share), in "
        "trajectories and picture drills"))] = False
    rephrase_refs: Annotated[bool, Field(description=(
        "rephrase draws picture references from a longer list (\"the gate in the photo\", \"... in the "
        "shot\")"))] = False
    rephrase_openings: Annotated[bool, Field(description=(
        "rephrase_pictures also draws stems that open on a place (\"On the tiny badge, what character is "
        "printed?\")"))] = False
    drill_contrast: Annotated[bool, Field(description=(
        "each two-hop second query drill also asked about the other person attribute: born / birthplace "
        "(contrast.py)"))] = False
    copy_every: Annotated[int, Field(ge=0, description=(
        "every Nth step a batch of the synthetic copying task, N >= 2 (0: never; copying.py)"))] = 0
    copy_warmup: Annotated[int, Field(ge=0, description=(
        "steps of the copying task alone first (lengths widen over the first 80% of them)"))] = 0
    copy_batch: Annotated[int, Field(ge=1, description="rows per copying batch")] = 32
    repeat: Annotated[KindRepeats, Field(
        description="that question kind's trajectories N times per epoch, e.g. {two_hop: 8, search: 2}",
        json_schema_extra={"form": "{KIND: N, ...}"})] = ()
    pictures_every: Annotated[int, Field(ge=0, description=(
        "every Nth step a batch of picture drills: visual/detail trajectories with a freshly drawn picture "
        "(0: never; 1: every step, a reading phase; picture_drills.py)"))] = 0
    pictures_batch: Annotated[int, Field(ge=1, description="drills per picture batch")] = 32
    picture_moves: Annotated[bool, Field(description=(
        "picture drills also of first moves (search, two-hop, knowledge), not only of reading"))] = True
    freeze_vision: Annotated[bool, Field(description=(
        "keep the vision tower as loaded (e.g. what `train vision` taught it); train the language model "
        "only"))] = False
    zoom: Annotated[ZoomStyle, Field(description=(
        "the zoom box of detail trajectories and drills: tight (the gold box), strip (its rows, the whole "
        "width), wide (3x its width) or coarse (two calls: the strip, then the wide columns in the strip's "
        "crop)"))] = "tight"
    zoom_jitter: Annotated[float, Field(ge=0.0, le=3.0, description=_jitter("picture drills' crops"))] = 0.0
    zoom_edge_jitter: Annotated[float, Field(ge=0.0, le=0.5, description=(
        "then each edge of a picture drill's crop moves by up to this share of the gold box's size: other "
        "rows and scales, as a model's own boxes have"))] = 0.0
    zoom_retry: Annotated[Share, Field(description=(
        "share of the plaque's picture drills whose first zoom misses the plaque (moved sideways) and whose "
        "second zoom finds it: a model that misses learns to look again"))] = 0.0
    zoom_sign: Annotated[bool, Field(description=(
        "questions about the big sign zoom on it before they answer (the tiny tower cannot read it at the "
        "question image's 35 tokens); the world is not changed (look_zoom.py)"))] = False
    zoom_sign_on: Annotated[Names, one_of(SIGN_ATTRIBUTES, "sign attributes"), Field(description=(
        "with zoom_sign, the sign questions that zoom, by what they ask: some of shape, char"))
    ] = SIGN_ATTRIBUTES
    zoom_count: Annotated[bool, Field(description="count questions zoom on the motif before they answer")
                          ] = False
    search_count: Annotated[bool, Field(description=(
        "count questions take a search question's moves: image search, text search for the entity's "
        "description (it holds the count; no tiny tower here counts), answer; the world is not changed "
        "(look_search.py)"))] = False
    grow_layers: Annotated[int, Field(ge=0, le=16, description=(
        "append N decoder layers to the language model before training, each starting as the identity: "
        "room to learn more without losing what init knows (grow.py)"))] = 0
    vision_lr_scale: Annotated[float, Field(ge=0.01, le=1.0, description=(
        "train the vision tower with the language model at this share of the learning rate (1: alike); "
        "not with freeze_vision"))] = 1.0

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        """The combinations that would train something else than asked, refused before any work."""
        if self.copy_every == 1:
            raise ValueError("copy_every: takes 0 (never) or N >= 2 (every Nth step)")
        for name in ("rephrase_pictures", "rephrase_refs"):
            if getattr(self, name) and not self.rephrase:
                raise ValueError(f"{name}: needs a rephrase share above 0")
        if self.rephrase_openings and not self.rephrase_pictures:
            raise ValueError("rephrase_openings: rephrases picture questions: it needs rephrase_pictures")
        if self.zoom_count and self.search_count:
            raise ValueError("zoom_count, search_count: two routes for the same questions: take one")
        if self.freeze_vision and self.vision_lr_scale != 1.0:
            raise ValueError("vision_lr_scale: sets the rate of a tower that freeze_vision keeps still: "
                             "take one")
        if self.label_only and self.format != "ssr":
            raise ValueError("label_only: applies to ssr trajectories (format: ssr)")
        return self

"""``ssr-lab train vision``'s recipe: the vision tower's run, from a model folder to a model folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field
from pydantic.dataclasses import dataclass

from ssr_lab.train.config.fields import RECIPE, Names, Share, ZoomStyle, one_of
from ssr_lab.train.vision_heads import HEADS, LABELS


@dataclass(frozen=True, config=RECIPE)
class VisionConfig:
    """Train the vision tower on freshly drawn pictures (heads on what questions read, not kept)."""

    init: Annotated[Path, Field(description="the model folder whose vision tower is trained")]
    out: Annotated[Path, Field(description="where the model goes")]
    steps: Annotated[int, Field(ge=1, description="optimizer steps planned")] = 1000
    batch_size: Annotated[int, Field(ge=1, description="pictures per step")] = 32
    lr: Annotated[float, Field(gt=0.0, description="peak learning rate")] = 1e-3
    warmup: Annotated[int, Field(ge=0, description="steps of linear warm-up")] = 50
    weight_decay: Annotated[float, Field(ge=0.0, description="AdamW weight decay")] = 0.01
    reinit: Annotated[bool, Field(description="start the tower from fresh weights")] = False
    grow: Annotated[int, Field(ge=0, le=8, description=(
        "append this many blocks to the tower, each starting as the identity (the language model reads the "
        "same tokens until training moves them)"))] = 0
    seed: Annotated[int, Field(description="seeds the pictures and the heads")] = 0
    threads: Annotated[int | None, Field(description="torch threads (null: all cores)")] = None
    max_minutes: Annotated[float, Field(description="wall-clock budget: saves and stops past it")] = 28.0
    log_every: Annotated[int, Field(ge=1, description="steps between train_log.jsonl lines")] = 25
    eval_pictures: Annotated[int, Field(ge=1, description="fresh pictures the final accuracies are "
                                                          "measured on")] = 256
    heads: Annotated[Names, one_of(HEADS, "heads"), Field(description=(
        "some of colour, count, sign, plaque, count_mean (count from the tokens' mean), known (well-known "
        "entities), plaque_x, plaque_y (where the plaque is, in tenths), sign_crop, count_crop (the big "
        "sign, the count read from a zoom crop around the sign, the motif)"))] = tuple(LABELS)
    known_share: Annotated[Share, Field(description=(
        "with the known head: share of pictures of well-known entities"))] = 0.25
    anchor: Annotated[float, Field(ge=0.0, description=(
        "weight of the tokens' drift from the initial tower's (0: free; keeps what SFT taught)"))] = 0.0
    anchor_crops: Annotated[float | None, Field(ge=0.0, description=(
        "the same for the zoom crops' tokens (null: as anchor; 0 frees a crop style the language model has "
        "not read yet while the question pictures stay anchored)"))] = None
    image_pixels: Annotated[int | None, Field(ge=4096, description=(
        "resize every picture to about this many pixels, and the model keeps it (null: as init does); "
        "143360 = 448x320, four times the tokens of the world's pictures"))] = None
    max_pixels: Annotated[int | None, Field(ge=4096, description=(
        "only the most pixels a picture keeps, and the model keeps it: the question images (35,840 px) stay "
        "as they are, a wider zoom crop (a strip: 1024x123) gets more tokens"))] = None
    zoom: Annotated[ZoomStyle, Field(description=(
        "the plaque head reads the crop at the zoom box of this style: tight (the gold box), strip (its "
        "rows, the whole width), wide (3x its width; coarse reads the same crop)"))] = "tight"
    zoom_jitter: Annotated[float, Field(ge=0.0, le=3.0, description=(
        "the crops move sideways by a random amount up to this many gold-box widths (0: centred), as a "
        "model's imprecise zoom box makes them"))] = 0.0
    zoom_edge_jitter: Annotated[float, Field(ge=0.0, le=0.5, description=(
        "then each crop edge moves by up to this share of the gold box's size"))] = 0.0

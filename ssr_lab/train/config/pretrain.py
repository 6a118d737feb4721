"""``ssr-lab train pretrain``'s recipe: next-token pretraining of a fresh model, the base for SFT."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field
from pydantic.dataclasses import dataclass

from ssr_lab.train.config.fields import RECIPE, Share


@dataclass(frozen=True, config=RECIPE)
class PretrainConfig:
    """Next-token pretraining of a fresh model on the training entities' corpus (the base for SFT)."""

    world: Annotated[Path, Field(description="a `world build` folder")]
    out: Annotated[Path, Field(description="where the model goes")]
    init: Annotated[str, Field(description="the shape HxL[-tied] of the fresh model")] = "128x4-tied"
    library: Annotated[str, Field(description=(
        "the tokenizer learns the library's texts too (as `train sft` does)"))] = "default"
    steps: Annotated[int, Field(ge=1, description="optimizer steps planned")] = 1000
    batch_size: Annotated[int, Field(ge=1, description="rows per step")] = 16
    seq_len: Annotated[int, Field(ge=8, description="tokens per row")] = 384
    lr: Annotated[float, Field(gt=0.0, description="peak learning rate")] = 3e-3
    min_lr_ratio: Annotated[Share, Field(description="the cosine decay's floor, as a share of lr")] = 0.1
    warmup: Annotated[int, Field(ge=0, description="steps of linear warm-up")] = 50
    weight_decay: Annotated[float, Field(ge=0.0, description="AdamW weight decay")] = 0.01
    clip: Annotated[float, Field(gt=0.0, description="gradient norm clip")] = 1.0
    seed: Annotated[int, Field(description="seeds the fresh model and the rows drawn")] = 0
    max_minutes: Annotated[float, Field(description="wall-clock budget: saves and stops past it")] = 10.0
    log_every: Annotated[int, Field(ge=1, description="steps between train_log.jsonl lines")] = 10
    threads: Annotated[int | None, Field(description="torch threads (null: all cores)")] = None
    rename: Annotated[bool, Field(description=(
        "a fresh invented name per entity group: copying, not remembering"))] = True
    questions: Annotated[bool, Field(description=(
        "each entity group followed by its named questions and their answers"))] = True

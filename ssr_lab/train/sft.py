"""``ssr-lab train sft``: supervised fine-tuning on a world's oracle trajectories.

Plain PyTorch rather than TRL's SFTTrainer: the two things that make training affordable on two CPU
cores are not in TRL's multimodal path - the loss restricted to assistant tokens of multi-turn,
multi-image trajectories, and the shared system-prompt prefix run once per batch (a third of the
tokens; see ``data.py``). The loop is AdamW, linear warm-up then cosine decay, gradient clipping,
deterministic for a seed, with resumable checkpoints and a bounded wall-clock budget.

A run is four steps, each its own module: the data (``sft_data.py``: questions, model, trajectories), the
augmentations (``sft_augment.py``: what a drawn batch becomes, the drills added), the schedule
(``sft_schedule.py``: every step's batch, planned up front) and the loop (``sft_loop.py``). This module
runs them in order and writes the model, its card and its figures.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict
from typing import Any

import torch

from ssr_lab.train.checkpoint import latest_checkpoint, reproduce, resume, write_card
from ssr_lab.train.config.sft import SFTConfig
from ssr_lab.train.copying import CopyTask
from ssr_lab.train.data import Collator
from ssr_lab.train.sft_augment import Augmentations
from ssr_lab.train.sft_data import load_data
from ssr_lab.train.sft_loop import Checkpoints, StepLoss, optimizer_for, run_loop
from ssr_lab.train.sft_schedule import COPY, PICTURES, plan, repeated
from ssr_server.engine.tiny import save_model, write_processor_config

__all__ = ["SFTConfig", "train_sft"]


def train_sft(cfg: SFTConfig, progress: bool = True) -> dict[str, Any]:
    """Train, save ``cfg.out`` (model + card + log) and return the run's figures."""
    from transformers import AutoImageProcessor

    started = time.perf_counter()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    random.seed(cfg.seed)
    data = load_data(cfg, progress)
    data_minutes = (time.perf_counter() - started) / 60
    cfg.out.mkdir(parents=True, exist_ok=True)
    write_processor_config(cfg.out, data.pixels)  # the image processing every loader of the result will use
    processor = AutoImageProcessor.from_pretrained(cfg.out, backend="pil")
    collate = Collator(data.model, processor, data.tok.pad_token_id or 0)
    pool = repeated(data.examples, cfg.repeat)
    augment = Augmentations.of(cfg, data, pool)
    schedule = plan(cfg, pool, augment.drills)

    config = {k: str(v) for k, v in asdict(cfg).items()}
    commands = reproduce(cfg.world, cfg.init)
    meta: dict[str, Any] = {"config": config, "command": "\n".join(commands), "commands": commands}
    optimizer, trained = optimizer_for(cfg, data.model)
    ckpt = latest_checkpoint(cfg.out)
    step = resume(ckpt, data.model, optimizer) if ckpt is not None else 0
    loss_of = StepLoss(cfg, data.model, collate, CopyTask.for_tokenizer(data.tok), augment)
    checkpoints = Checkpoints(data.tok, data.pixels, meta)
    done = run_loop(cfg, step, schedule, loss_of, optimizer, trained, checkpoints, started, progress)

    model = data.model
    figures = {
        "steps": done.step, "planned_steps": cfg.steps,
        "stopped_at_time_budget": done.stopped_at_time_budget, "examples": len(data.examples),
        "dropped_trajectories": data.dropped, "epochs_planned": schedule.epochs,
        "first_loss": done.first_loss, "final_loss_ema": done.loss_ema,
        "minutes": (time.perf_counter() - started) / 60, "data_minutes": data_minutes,
        "drills": (f"{len(augment.drills.answers)} answer, {len(augment.drills.queries)} query"
                   if augment.drills else "none"),
        "contrast_drills": augment.contrasts,
        "copy_steps_planned": schedule.count(COPY, cfg.steps),
        "picture_steps_planned": schedule.count(PICTURES, cfg.steps),
        "picture_sources": len(augment.pictures.sources) if augment.pictures is not None else 0,
        "tokens_per_s": done.tokens_per_s,
        "parameters": sum(p.numel() for p in model.parameters()),
        "trained_parameters": sum(p.numel() for p in trained),
    }
    model.eval()
    meta_out = {"trained": "sft", "format": cfg.format, **config, "commands": commands}
    save_model(model, data.tok, cfg.out, meta_out, data.pixels)
    write_card(cfg.out, {
        "title": f"SSR {cfg.format}-SFT of {cfg.init}", "command": meta["command"],
        "description": f"A Qwen3-VL-architecture model trained by `ssr-lab train sft` on the oracle "
                       f"trajectories ({cfg.format} form) of the world in {cfg.world}.",
        **figures, **{f"config.{k}": v for k, v in config.items()}})
    return figures

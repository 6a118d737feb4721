"""``train sft``, step 4 - the loop: AdamW over the planned schedule, with checkpoints and a time budget.

Each step sets the learning rate (the cosine schedule's or, with ``anneal_by_time``, the further of it and
the budget's share spent), computes the step's loss (the copying task, or a picture or trajectory batch
augmented as drawn, cross-entropy on assistant tokens only), clips and steps. Checkpoints every
``save_every`` steps and when the budget runs out make the run resumable: started again with the same
recipe, it continues from the last one with the same batches (the schedule is fixed up front).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ssr_lab.train.checkpoint import save_checkpoint
from ssr_lab.train.config.sft import SFTConfig
from ssr_lab.train.copying import CopyTask, copy_loss
from ssr_lab.train.data import Example, token_logits
from ssr_lab.train.schedule import budget_step, cosine_lr
from ssr_lab.train.setup import param_groups, trainable
from ssr_lab.train.sft_augment import STEP_SEED, Augmentations
from ssr_lab.train.sft_schedule import COPY, Schedule
from ssr_server.core.progress import progress_bar
from ssr_server.engine.tiny import Pixels


def optimizer_for(cfg: SFTConfig, model: Any) -> tuple[torch.optim.Optimizer, list[torch.nn.Parameter]]:
    """AdamW over the trained parameters (the tower's at ``vision_lr_scale`` of the rate, or frozen)."""
    trained = trainable(model, cfg.freeze_vision)
    optimizer = torch.optim.AdamW(param_groups(model, trained, cfg.vision_lr_scale), lr=cfg.lr,
                                  betas=(0.9, 0.98), weight_decay=cfg.weight_decay)
    return optimizer, trained


@dataclass(frozen=True)
class StepLoss:
    """The loss of one planned step, and the tokens it read."""

    cfg: SFTConfig
    model: Any
    collate: Callable[[list[Example]], Any]
    copying: CopyTask
    augment: Augmentations

    def __call__(self, step: int, planned: list[Example] | str) -> tuple[torch.Tensor, int]:
        cfg = self.cfg
        if planned == COPY:  # seeded per step, like the names: a resumed run draws the same rows
            generator = torch.Generator().manual_seed(cfg.seed * STEP_SEED + step)
            widened = step / (0.8 * cfg.copy_warmup) if cfg.copy_warmup else 1.0
            return copy_loss(self.model, self.copying, cfg.copy_batch, generator, widened)
        drawn = (self.augment.picture_batch(step) if isinstance(planned, str)
                 else self.augment.trajectories(planned, step))
        collated = self.collate(drawn)
        loss = torch.nn.functional.cross_entropy(token_logits(self.model, collated), collated.targets)
        return loss, collated.tokens


@dataclass(frozen=True)
class Checkpoints:
    """What a checkpoint saves besides the weights and the optimizer: the tokenizer, the picture size the
    model sees, and the run's metadata (its config and the commands that made it)."""

    tok: Any
    pixels: Pixels
    meta: dict[str, Any]

    def save(self, cfg: SFTConfig, model: Any, optimizer: torch.optim.Optimizer, step: int) -> None:
        save_checkpoint(cfg.out, model, self.tok, optimizer, step, self.meta, pixels=self.pixels)


@dataclass(frozen=True)
class LoopResult:
    step: int  # the last step done
    first_loss: float | None
    loss_ema: float | None
    tokens_per_s: float
    stopped_at_time_budget: bool


def run_loop(cfg: SFTConfig, step: int, schedule: Schedule, loss_of: StepLoss,
             optimizer: torch.optim.Optimizer, trained: list[torch.nn.Parameter], checkpoints: Checkpoints,
             started: float, progress: bool = True) -> LoopResult:
    """Steps from ``step`` (0, or a resumed checkpoint's) to ``cfg.steps`` or the budget (``started``: when
    the run began, by ``time.perf_counter``), logging to ``OUT/train_log.jsonl``."""
    model = loss_of.model
    model.train()
    bar = progress_bar(total=cfg.steps, initial=step, desc=f"sft {cfg.format}", unit="step",
                       disable=not progress)
    ema: float | None = None
    tokens_seen, t_mark, first_loss = 0, time.perf_counter(), None
    stopped_early = False
    with (cfg.out / "train_log.jsonl").open("a", encoding="utf-8") as log:
        while step < cfg.steps:
            at = (budget_step(step, cfg.steps, (time.perf_counter() - started) / 60, cfg.max_minutes)
                  if cfg.anneal_by_time else step)
            for group in optimizer.param_groups:
                group["lr"] = cosine_lr(at, cfg.lr, cfg.warmup, cfg.steps, cfg.min_lr_ratio) * group["scale"]
            loss, tokens = loss_of(step, schedule.order[step])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(trained, cfg.clip)
            optimizer.step()
            step += 1
            value = float(loss.detach())
            first_loss = value if first_loss is None else first_loss
            ema = value if ema is None else 0.95 * ema + 0.05 * value
            tokens_seen += tokens
            elapsed = time.perf_counter() - t_mark
            bar.update(1)
            bar.set_postfix(loss=f"{ema:.3f}", tok_s=f"{tokens_seen / max(elapsed, 1e-9):.0f}", refresh=False)
            if step % cfg.log_every == 0 or step == cfg.steps:
                log.write(json.dumps({"step": step, "loss": value, "loss_ema": ema,
                                      "lr": optimizer.param_groups[0]["lr"],
                                      "tokens_per_s": tokens_seen / max(elapsed, 1e-9)}) + "\n")
                log.flush()
            out_of_time = (time.perf_counter() - started) / 60 > cfg.max_minutes
            if step % cfg.save_every == 0 or out_of_time:
                checkpoints.save(cfg, model, optimizer, step)
            if out_of_time:
                stopped_early = True
                break
    bar.close()
    return LoopResult(step, first_loss, ema, tokens_seen / max(time.perf_counter() - t_mark, 1e-9),
                      stopped_early)


"""The learning-rate schedule of every trainer: linear warm-up, then cosine decay to a floor."""

from __future__ import annotations

import math


def cosine_lr(step: int, lr: float, warmup: int, steps: int, min_ratio: float) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, steps - warmup))
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def budget_step(step: int, steps: int, spent_minutes: float, max_minutes: float) -> int:
    """The schedule's step for a run that anneals by its time budget too: the further of ``step`` and the
    share of ``max_minutes`` already spent, in steps. A run that its budget will cut short (a slower machine
    than planned for) then still reaches the schedule's floor when it stops, instead of stopping mid-decay."""
    if max_minutes <= 0:
        return step
    return max(step, min(steps, int(steps * spent_minutes / max_minutes)))

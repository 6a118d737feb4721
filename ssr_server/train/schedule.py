"""The learning-rate schedule of every trainer: linear warm-up, then cosine decay to a floor."""

from __future__ import annotations

import math


def cosine_lr(step: int, lr: float, warmup: int, steps: int, min_ratio: float) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, steps - warmup))
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t)))

"""What every bench shares: timing a call by the median of repeats, and writing its figures as JSON."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``repeats`` calls of ``fn``, in ms, after one untimed warm-up call
    (allocator, KV capacity, lazy initialisation)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def write_json(path: str | Path, figures: Any) -> None:
    """The bench's figures at ``path`` (its folder made if missing)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(figures, indent=1), encoding="utf-8")

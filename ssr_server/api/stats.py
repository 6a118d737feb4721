"""Exact latency percentiles over a sliding window, for people without Prometheus (``/v1/stats``)."""

from __future__ import annotations

import threading
from collections import defaultdict, deque
from typing import Any

import numpy as np

from ssr_server.agent.trace import Run

SERIES = ("reasoning_s", "action_s", "turn_s", "run_s", "model_s")


class LatencyWindow:
    def __init__(self, size: int = 2000) -> None:
        self.size = size
        self._data: dict[tuple[str, str], deque[float]] = defaultdict(lambda: deque(maxlen=size))
        self._outcomes: dict[tuple[str, str], int] = defaultdict(int)
        self._lock = threading.Lock()

    def add_run(self, run: Run) -> None:
        with self._lock:
            m = run.mode
            for t in run.turns:
                self._data[("reasoning_s", m)].append(t.reasoning_s)
                self._data[("action_s", m)].append(t.action_s)
                self._data[("turn_s", m)].append(t.turn_s)
            self._data[("run_s", m)].append(run.total_s)
            self._data[("model_s", m)].append(run.model_s)
            self._outcomes[(m, run.outcome)] += 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = {"window": self.size, "modes": {}}
            for (series, mode), values in sorted(self._data.items()):
                arr = np.asarray(values, dtype=float)
                if arr.size == 0:
                    continue
                p50, p95, p99 = np.percentile(arr, [50, 95, 99])
                out["modes"].setdefault(mode, {})[series] = {
                    "count": int(arr.size), "mean": float(arr.mean()), "p50": float(p50),
                    "p95": float(p95), "p99": float(p99), "max": float(arr.max()),
                }
            for (mode, outcome), n in sorted(self._outcomes.items()):
                out["modes"].setdefault(mode, {}).setdefault("outcomes", {})[outcome] = n
            return out

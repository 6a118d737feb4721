"""How many tokens of a long prefill may share a forward with other runs' decode steps and scoring.

A forward costs about ``base + per_token * n``: ``base`` is what a forward of decode steps alone costs,
``n`` the tokens of multi-token work in it (candidates, prefill chunks; their cost is mostly attention
over a long past). Both are learnt from the forwards the scheduler runs (medians of the latest), so the chunk
that keeps a forward within ``slowdown x`` what it would cost without the chunk follows the hardware,
the model and the past length. Measured on the tiny model (CPU, 1 thread, 4,000-token context): a
decode-only forward 0.56 ms, each prefill token against that past +0.11 ms - a fixed chunk of 512
made the other run's next token 37x late, the paced chunks (2-6 tokens) about 2x. On a GPU a 2B decode
forward costs more than hundreds of prefill tokens add, and the same rule gives chunks of the maximum.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field


@dataclass
class Pacer:
    slowdown: float  # 0: no pacing, chunks of max_chunk
    min_chunk: int
    max_chunk: int
    window: int = 31  # medians of the latest samples: a machine shared with other processes adds
    # multi-millisecond outliers that a moving average would carry into every chunk size
    last: int = 0  # the previous paced chunk: the next one is at most twice as large
    _base: deque[float] = field(default_factory=deque, repr=False)
    _per_token: deque[float] = field(default_factory=deque, repr=False)

    @property
    def base_s(self) -> float | None:
        """What a forward of decode steps alone costs (median of the latest)."""
        return statistics.median(self._base) if self._base else None

    @property
    def per_token_s(self) -> float | None:
        """What each token of multi-token work adds to a forward (median of the latest)."""
        return statistics.median(self._per_token) if self._per_token else None

    def observe(self, seconds: float, tokens: int) -> None:
        """One forward (with its bookkeeping) took ``seconds`` and carried ``tokens`` tokens of
        multi-token work (candidates and prefill chunks; decode steps not counted)."""
        if tokens == 0:
            self._push(self._base, seconds)
        elif (base := self.base_s) is not None:
            self._push(self._per_token, max(seconds - base, 0.0) / tokens)

    def _push(self, samples: deque[float], x: float) -> None:
        samples.append(x)
        if len(samples) > self.window:
            samples.popleft()

    def chunk(self, other_tokens: int = 0) -> int:
        """Prefill tokens allowed in a forward that already carries decode steps and ``other_tokens``
        tokens of other multi-token work."""
        if self.slowdown <= 0:
            return self.max_chunk
        base, per_token = self.base_s, self.per_token_s
        if base is None or per_token is None:
            return self.min_chunk  # learn the cost with a small chunk first
        n = self.max_chunk
        if per_token > 0:
            n = int((self.slowdown - 1.0) * (base / per_token + other_tokens))
        # A few noisy samples of small chunks can make tokens look free: grow at most 2x per
        # forward (one 512-token jump measured 12 ms against a 0.6 ms decode step).
        return max(self.min_chunk, min(self.max_chunk, n, 2 * max(self.last, self.min_chunk)))

    def used(self, tokens: int) -> None:
        """A paced chunk of ``tokens`` went into a forward."""
        self.last = tokens

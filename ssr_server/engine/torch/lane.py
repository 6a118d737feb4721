"""A second model thread for heavy forwards, so that decode steps do not wait behind them.

With several runs at a time, one run's selection (its observation's prefill, a picture's vision tower
and the candidates: ~45 ms on the shipped model on this project's machine) shares the forward with the
other runs' decode steps (~3 ms each): every decode step that lands beside it waits 45 ms. SGLang and
vLLM answer this on GPUs by disaggregating prefill from decode; on a CPU with a spare core the same
split fits in one process: the scheduler hands heavy work (score jobs, contexts prefilled whole) to
this lane, one batch at a time, and goes on with decode steps and short action prompts on its own
thread meanwhile. The lane only runs the forward: planning and applying its results (the prefix cache,
the jobs' futures) stay on the scheduler's thread, so no engine state is shared but the model's
weights (read only) and tensors no other job touches while the lane holds them.

PyTorch releases the GIL inside its operators, so two forwards overlap on two cores; their Python
parts take turns. It pays only with one intra-op thread per forward (``SSR_TORCH_THREADS=1``): with
more, two forwards oversubscribe the cores (``auto`` turns the lane on exactly then). It is a trade:
decode steps no longer wait, but selections queue for the one lane (and share the GIL with the decode
steps), so they take longer under concurrency; off by default.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
from collections.abc import Callable
from typing import Any

from ssr_server.engine.torch.batch import Batch


def wanted(setting: str, threads: int | None) -> bool:
    """Whether to run a lane: ``on``, ``off``, or ``auto`` (one intra-op thread and a spare core)."""
    if setting == "auto":
        return threads == 1 and (os.cpu_count() or 1) >= 2
    return setting == "on"


class Lane:
    def __init__(self, wake: threading.Condition) -> None:
        self._pool = cf.ThreadPoolExecutor(1, thread_name_prefix="ssr-torch-lane")
        self._wake = wake  # the scheduler's condition: notified when a batch is done
        self._batch: Batch | None = None
        self._future: cf.Future[Any] | None = None

    @property
    def busy(self) -> bool:
        """A batch is on the lane (running, or done and not yet taken)."""
        return self._future is not None

    @property
    def done(self) -> bool:
        return self._future is not None and self._future.done()

    def jobs(self) -> list[Any]:
        return [w.owner for w in self._batch.works] if self._batch is not None else []

    def submit(self, batch: Batch, forward: Callable[[Batch], Any]) -> None:
        assert self._future is None, "internal: one batch on the lane at a time"
        self._batch = batch
        self._future = self._pool.submit(forward, batch)
        self._future.add_done_callback(self._notify)

    def _notify(self, _: cf.Future[Any]) -> None:
        with self._wake:
            self._wake.notify_all()

    def take(self) -> tuple[Batch, Any]:
        """The batch and its forward's outputs; the lane is free. If the forward raised, this raises it
        and the batch stays (``jobs`` names them for failing)."""
        assert self._future is not None and self._batch is not None
        outs = self._future.result()
        batch, self._batch, self._future = self._batch, None, None
        return batch, outs

    def take_quietly(self) -> None:
        """Free the lane of a batch whose jobs the caller fails anyway."""
        self._batch = self._future = None

    def close(self) -> None:
        self._pool.shutdown(wait=True)

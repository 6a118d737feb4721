"""The embedded engine: the async Engine protocol over the scheduler's worker thread."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import torch

from ssr_server.engine.base import CandidateScore, Context, Generation, GenerationParams
from ssr_server.engine.torch.loader import LoadedModel, load_model
from ssr_server.engine.torch.prefix_cache import PrefixCache
from ssr_server.engine.torch.runner import ModelRunner
from ssr_server.engine.torch.scheduler import GenerateJob, Job, Scheduler, ScoreJob
from ssr_server.errors import EngineUnavailable, InvalidRequest


class TorchEngine:
    """In-process transformers model; CPU or GPU; batches concurrent runs on one worker thread."""

    def __init__(self, model: str | LoadedModel, *, dtype: str = "fp32", device: str = "cpu",
                 cache_bytes: int = 1 << 30, threads: int | None = None, bf16_matmul: str = "auto") -> None:
        self.lm = model if isinstance(model, LoadedModel) else load_model(
            model, dtype=dtype, device=device, bf16_matmul=bf16_matmul)
        if threads:
            # torch's default (all cores) was the fastest on a quiet 2-core machine, even for the tiny
            # model (bench serve: 9.5 vs 8.8 runs/s alone, 25.6 vs 21.4 at 8 concurrent runs); with
            # other CPU-heavy processes beside it OpenMP's spin-waits make 1 thread the better choice
            # (measured 1.6 vs 22 ms per tiny decode step then): SSR_TORCH_THREADS=1.
            torch.set_num_threads(threads)
        self.prefix_cache = PrefixCache(cache_bytes)
        self.runner = ModelRunner(self.lm, self.prefix_cache)
        self.scheduler = Scheduler(self.runner, self.lm.eos_token_ids)

    @property
    def name(self) -> str:
        return "torch"

    @property
    def tokenizer(self) -> Any:
        return self.lm.tokenizer

    @property
    def model_name(self) -> str:
        return self.lm.name

    @property
    def image_token_id(self) -> int | None:
        return self.lm.image_token_id

    async def score(self, context: Context, candidates: Sequence[Sequence[int]]) -> list[CandidateScore]:
        cands = [list(c) for c in candidates]
        if not cands or any(len(c) == 0 for c in cands):
            raise InvalidRequest("candidates must be a non-empty list of non-empty token lists")
        vocab = self.runner.vocab_size
        if any(t < 0 or t >= vocab for c in cands for t in c):
            raise InvalidRequest(f"candidate token ids must lie in [0, {vocab})")
        if self.lm.image_token_id is not None and any(self.lm.image_token_id in c for c in cands):
            raise InvalidRequest("candidates must not contain image placeholder tokens")
        result = await self._run(ScoreJob(context, candidates=cands))
        assert isinstance(result, list)
        return result

    async def generate(self, context: Context, params: GenerationParams) -> Generation:
        if params.max_new_tokens < 1:
            raise InvalidRequest("max_new_tokens must be >= 1")
        result = await self._run(GenerateJob(context, params=params))
        assert isinstance(result, Generation)
        return result

    async def _run(self, job: Job) -> object:
        if not self.scheduler.alive:
            raise EngineUnavailable("the embedded engine's worker is not running")
        fut = self.scheduler.submit(job)
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            job.cancelled = True  # the worker drops it at its next iteration
            raise

    async def ready(self) -> bool:
        return self.scheduler.alive

    async def close(self) -> None:
        await asyncio.to_thread(self.scheduler.close)

    def stats(self) -> dict[str, Any]:
        c = self.prefix_cache
        return {"prefix_cache_entries": len(c), "prefix_cache_bytes": c.nbytes, "prefix_cache_hits": c.hits,
                "prefix_cache_misses": c.misses, "prefix_cache_hit_tokens": c.hit_tokens,
                "batches": self.scheduler.batches, "max_batch": self.scheduler.max_batch}

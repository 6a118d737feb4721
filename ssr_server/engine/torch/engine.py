"""The embedded engine: the async Engine protocol over the scheduler's worker thread."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import torch

from ssr_server.core.errors import ContextTooLong, EngineError, EngineUnavailable, InvalidRequest
from ssr_server.core.protocol import CandidateScore, Context, Generation, GenerationParams, Grammar
from ssr_server.engine.torch.config import EngineConfig
from ssr_server.engine.torch.grammar import GrammarCache, GrammarState
from ssr_server.engine.torch.jobs import GenerateJob, Job, ScoreJob
from ssr_server.engine.torch.loader import LoadedModel, load_model, resolve_dtype
from ssr_server.engine.torch.prefix_cache import PrefixCache
from ssr_server.engine.torch.runner import ModelRunner
from ssr_server.engine.torch.scheduler import Scheduler

log = logging.getLogger(__name__)


class TorchEngine:
    """In-process transformers model; CPU or GPU; batches concurrent runs on one worker thread.

    ``model`` is a model directory / hub id (loaded as ``config`` says) or an already loaded model
    (whose device and dtype must then be the config's). ``start=False`` runs no worker thread: the
    caller drives ``scheduler.step()`` (tests that run the engine under a meta default device)."""

    def __init__(self, model: str | LoadedModel, config: EngineConfig | None = None, *,
                 start: bool = True) -> None:
        self.config = cfg = config or EngineConfig()
        if cfg.threads:
            # torch's default (all cores) was the fastest on a quiet 2-core machine, even for the tiny
            # model (bench serve: 9.5 vs 8.8 runs/s alone, 25.6 vs 21.4 at 8 concurrent runs); with
            # other CPU-heavy processes beside it OpenMP's spin-waits make 1 thread the better choice
            # (measured 1.6 vs 22 ms per tiny decode step then): SSR_TORCH_THREADS=1.
            torch.set_num_threads(cfg.threads)
        if isinstance(model, LoadedModel):
            if model.device.type != torch.device(cfg.device).type or model.dtype != resolve_dtype(cfg.dtype):
                raise EngineError(f"the loaded model is {model.dtype} on {model.device}, the engine config "
                                  f"says {cfg.dtype} on {cfg.device}")
            self.lm = model
            if cfg.exact and vars(model.model).get("ssr_fp32_matmul_layers", 0):
                log.warning("exact drafts on a model loaded for an engine without them: its multi-row "
                            "bf16 products go through the fp32 kernel, so drafts may change the text "
                            "(load it with this engine's config)")
        else:
            self.lm = load_model(model, cfg)
        if cfg.slice_selections and cfg.exact:
            log.warning("slice_selections is ignored by an exact engine (%s with drafts): selections are "
                        "scored whole, so that their scores do not depend on timing", cfg.dtype)
        self.prefix_cache = PrefixCache(cfg.prefix_cache_bytes, cfg.prefix_cache_entries)
        self.runner = ModelRunner(self.lm, self.prefix_cache, max_context=cfg.max_context,
                                  exact=cfg.exact)
        self.scheduler = Scheduler(self.runner, self.lm.eos_token_ids, cfg, start=start)
        self.grammars = GrammarCache(self.lm.tokenizer, self.runner.vocab_size, self.lm.eos_token_ids,
                                     threads=min(cfg.threads or 2, 8))

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

    def _check_length(self, context: Context, need: int) -> None:
        # A cheap early refusal on the compact length (each image counts one token here); the exact
        # check, images expanded, runs when the worker resolves the context, before any forward.
        limit = self.runner.max_context
        if limit is not None and len(context) + need > limit:
            raise ContextTooLong(f"context of {len(context)} tokens + {need} more does not fit the "
                                 f"model's limit of {limit} tokens")

    async def score(self, context: Context, candidates: Sequence[Sequence[int]]) -> list[CandidateScore]:
        cands = [list(c) for c in candidates]
        if not cands or any(len(c) == 0 for c in cands):
            raise InvalidRequest("candidates must be a non-empty list of non-empty token lists")
        vocab = self.runner.vocab_size
        if any(t < 0 or t >= vocab for c in cands for t in c):
            raise InvalidRequest(f"candidate token ids must lie in [0, {vocab})")
        if self.lm.image_token_id is not None and any(self.lm.image_token_id in c for c in cands):
            raise InvalidRequest("candidates must not contain image placeholder tokens")
        self._check_length(context, max(len(c) for c in cands))
        result = await self._run(ScoreJob(context, candidates=cands))
        assert isinstance(result, list)
        return result

    async def generate(self, context: Context, params: GenerationParams) -> Generation:
        if params.max_new_tokens < 1:
            raise InvalidRequest("max_new_tokens must be >= 1")
        self._check_length(context, params.max_new_tokens)
        grammar = None
        if params.grammar is not None:
            # A grammar compiled already gets its matcher here (tens of microseconds, less than a hop to
            # a thread); a new one is compiled off the event loop and off the worker thread.
            compiled = self.grammars.cached(params.grammar)
            grammar = (self.grammars.state(compiled) if compiled is not None
                       else await asyncio.to_thread(self._grammar_state, params.grammar))
        result = await self._run(GenerateJob(context, params=params, grammar=grammar))
        assert isinstance(result, Generation)
        return result

    def _grammar_state(self, grammar: Grammar) -> GrammarState:
        return self.grammars.state(self.grammars.compile(grammar))

    async def _run(self, job: Job) -> object:
        if not self.scheduler.alive:
            raise EngineUnavailable("the embedded engine's worker is not running")
        fut = self.scheduler.submit(job)
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            job.cancelled = True  # the worker drops it at its next step
            raise

    async def ready(self) -> bool:
        return self.scheduler.alive

    async def close(self) -> None:
        await asyncio.to_thread(self.scheduler.close)

    def stats(self) -> dict[str, Any]:
        c, p = self.prefix_cache, self.scheduler.pacer
        return {"prefix_cache_entries": len(c), "prefix_cache_bytes": c.nbytes, "prefix_cache_hits": c.hits,
                "prefix_cache_misses": c.misses, "prefix_cache_hit_tokens": c.hit_tokens,
                "batches": self.scheduler.batches, "max_batch": self.scheduler.max_batch,
                "paced_prefill_chunk": p.chunk()}

"""Many agent runs, in process or against a running server, with bounded concurrency and a progress bar.

``ssr-server infer`` and ``ssr-lab eval`` both hand a list of ``Job``s to ``run_jobs``: a
``LocalRunner`` drives the agent loop on an engine in this process (the final context comes back too),
a ``RemoteRunner`` posts each job to ``POST /v1/agent/runs`` of a server (embedded or SGLang-backed).
A job that fails (bad image, HTTP error) becomes a result with ``error`` set; the others go on.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from ssr_server.agent.loop import Agent, RunOptions
from ssr_server.core.errors import SSRError
from ssr_server.core.images.intake import decode_image_bytes
from ssr_server.core.images.limits import ImageLimits
from ssr_server.core.progress import progress_bar
from ssr_server.core.protocol import ImageRef


@dataclass(frozen=True)
class Job:
    key: str  # unique within a batch (file and record names)
    question: str
    images: tuple[Path, ...]
    options: RunOptions
    meta: dict[str, Any] = field(default_factory=dict)  # carried to the result (gold answers, kinds, ...)


@dataclass
class Result:
    job: Job
    run: dict[str, Any] | None  # the run record (Run.to_dict() / the API's run), None on failure
    context_text: str | None = None  # the final context, decoded (local runs only)
    error: str | None = None
    images: list[dict[str, Any]] = field(default_factory=list)  # the image registry (local runs)


class Runner(Protocol):
    async def __call__(self, job: Job) -> Result: ...


class LocalRunner:
    """The agent loop in this process; images are read and checked like a request's."""

    def __init__(self, agent: Agent, limits: ImageLimits | None = None,
                 deadline_s: float | None = None) -> None:
        self.agent, self.limits, self.deadline_s = agent, limits or ImageLimits(), deadline_s

    async def __call__(self, job: Job) -> Result:
        try:
            refs = [await asyncio.to_thread(_load, p, self.limits) for p in job.images]
            run, ctx = await self.agent.run_with_context(job.question, refs, job.options,
                                                         deadline_s=self.deadline_s)
        except (OSError, SSRError) as exc:
            return Result(job, None, error=getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}")
        text = self.agent.engine.tokenizer.decode(list(ctx.token_ids), skip_special_tokens=False)
        images = [{"index": i, "digest": r.digest, "size": list(r.image.size)}
                  for i, r in enumerate(ctx.images)]
        return Result(job, run.to_dict(), context_text=text, images=images)


def _load(path: Path, limits: ImageLimits) -> ImageRef:
    return decode_image_bytes(path.read_bytes(), limits)


class RemoteRunner:
    """``POST /v1/agent/runs`` of a running ssr-server (loopback or not: the caller decides)."""

    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 600.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.AsyncClient(base_url=url.rstrip("/"), headers=headers, timeout=timeout_s,
                                        trust_env=False)

    async def __call__(self, job: Job) -> Result:
        o = job.options
        try:
            body = {"question": job.question, "mode": o.mode, "tau": o.tau, "alpha": o.alpha,
                    "max_turns": o.max_turns, "seed": o.seed, "label_only": o.label_only,
                    "reasoning_budget": o.reasoning_budget, "action_temperature": o.action_temperature,
                    "images": [base64.b64encode(p.read_bytes()).decode() for p in job.images]}
            body.update({"candidates": list(o.candidates)} if o.candidates else {"library": o.library})
            resp = await self.client.post("/v1/agent/runs", json=body)
        except (OSError, httpx.HTTPError) as exc:
            return Result(job, None, error=f"{type(exc).__name__}: {exc}")
        if resp.status_code != 200:
            return Result(job, None, error=f"HTTP {resp.status_code}: {resp.text[:300]}")
        return Result(job, resp.json())

    async def aclose(self) -> None:
        await self.client.aclose()


async def run_jobs(jobs: Sequence[Job], runner: Runner, concurrency: int = 1, *, progress: bool = True,
                   on_result: Callable[[Result], Awaitable[None] | None] | None = None,
                   description: str = "runs") -> list[Result]:
    """Every job through ``runner``, at most ``concurrency`` at a time; results in job order."""
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    gate = asyncio.Semaphore(concurrency)
    results: list[Result | None] = [None] * len(jobs)
    bar = progress_bar(total=len(jobs), desc=description, unit="run", disable=not progress)

    async def one(i: int, job: Job) -> None:
        async with gate:
            res = await runner(job)
        results[i] = res
        if on_result is not None:
            out = on_result(res)
            if out is not None:
                await out
        bar.update(1)
        answered = sum(1 for r in results if r is not None and r.run and r.run["outcome"] == "answered")
        bar.set_postfix(answered=answered, failed=sum(1 for r in results if r is not None and r.error),
                        refresh=False)

    try:
        await asyncio.gather(*(one(i, j) for i, j in enumerate(jobs)))
    finally:
        bar.close()
    return [r for r in results if r is not None]


def with_seed(options: RunOptions, seed: int) -> RunOptions:
    return dataclasses.replace(options, seed=seed)

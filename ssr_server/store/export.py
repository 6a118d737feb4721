"""Stored runs as training data: one JSON line per run in the trajectory record that ``ssr-server infer``
writes (``trajectory.json``: ``input``, ``seed``, ``status``, ``run``) and the lab reads, the run's images
inline as data: URLs (as the model saw them), so that a line stands on its own."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import IO, Any

from ssr_server.store.base import RunStore
from ssr_server.store.records import ACTIVE, RunFilter, StoredRun

PAGE = 100


def trajectory(run: StoredRun, images: list[str]) -> dict[str, Any]:
    s = run.summary
    usage = run.usage or {}
    record = {
        "id": s.id, "question": s.question, "mode": s.mode, "library": s.library,
        "outcome": s.outcome or s.status, "answer": s.answer, "error": s.error, "turns": run.turns,
        "total_s": s.total_s or 0.0, "model_s": s.model_s or 0.0, "tool_s": s.tool_s or 0.0,
        "prompt_tokens": usage.get("prompt_tokens", 0), "scored_tokens": usage.get("scored_tokens", 0),
        "generated_tokens": usage.get("generated_tokens", 0),
    }
    return {"input": {"id": s.id, "question": s.question, "images": images}, "seed": run.options.get("seed"),
            "options": run.options, "status": record["outcome"], "run": record,
            "stored": {"status": s.status, "created_at": s.created_at, "finished_at": s.finished_at}}


async def finished_runs(store: RunStore, where: RunFilter) -> AsyncIterator[StoredRun]:
    """Every finished run that matches, newest first (runs in flight are left for a later export)."""
    after: str | None = None
    while True:
        page = await store.list(where, PAGE, after)
        for summary in page.runs:
            if summary.status in ACTIVE:
                continue
            run = await store.get(summary.id)
            if run is not None:
                yield run
        if not page.has_more or not page.runs:
            return
        after = page.runs[-1].id


async def export(store: RunStore, where: RunFilter, out: IO[str], *, with_images: bool = True) -> int:
    """Write the matching finished runs to ``out``; how many."""
    count = 0
    async for run in finished_runs(store, where):
        images: list[str] = []
        if with_images:
            for info in run.images:
                if info.source != "input":
                    continue
                blob = await store.image(run.summary.id, info.n)
                if blob is not None:
                    images.append(f"data:{blob.media_type};base64,{base64.b64encode(blob.data).decode()}")
        out.write(json.dumps(trajectory(run, images), ensure_ascii=False) + "\n")
        count += 1
    return count

"""``ssr-lab eval``: a split of the benchmark through the real agent loop, records and a summary.

Questions run in process on the embedded engine (the world's tools) or against a running server, which
must serve the same world (``SSR_CORPUS_PATH=<world>/corpus.jsonl SSR_IMAGE_INDEX_DIR=<world>/images``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ssr_lab.eval.report import make_record, summarize
from ssr_lab.world.records import Question, load_questions
from ssr_server.agent.loop import RunOptions
from ssr_server.batch.runner import Job, Runner, run_jobs, with_seed


def select_questions(world: Path, split: str, limit: int | None = None,
                     kinds: Sequence[str] | None = None) -> list[Question]:
    """The split's questions (optionally of some kinds); ``limit`` takes them round-robin over the kinds,
    so that a small limit still covers every kind."""
    questions = [q for q in load_questions(world / "questions.jsonl")
                 if q.split == split and (not kinds or q.kind in kinds)]
    if limit is None or limit >= len(questions):
        return questions
    by_kind: dict[str, list[Question]] = {}
    for q in questions:
        by_kind.setdefault(q.kind, []).append(q)
    picked: list[Question] = []
    queues = [list(v) for _, v in sorted(by_kind.items())]
    while len(picked) < limit:
        for queue in queues:
            if queue and len(picked) < limit:
                picked.append(queue.pop(0))
    return picked


async def run_eval(questions: Sequence[Question], runner: Runner, world: Path, options: RunOptions,
                   candidate_actions: dict[str, str], *, concurrency: int = 1, seed: int = 0,
                   progress: bool = True) -> list[dict[str, Any]]:
    """One record per question, in question order."""
    jobs = [Job(q.id, q.question, (world / q.image,), with_seed(options, seed + i))
            for i, q in enumerate(questions)]
    results = await run_jobs(jobs, runner, concurrency, progress=progress, description="eval")
    return [make_record(q, r.run, r.error, candidate_actions)
            for q, r in zip(questions, results, strict=True)]


def write_eval(path: Path, settings: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    summary = summarize(records)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"settings": settings, "summary": summary, "records": records}, indent=1,
                               ensure_ascii=False))
    return summary

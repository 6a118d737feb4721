"""``ssr-server infer``: the SSR reference harness's batch workflow on our engines.

Input: a JSONL file, one example a line: ``{"id"?, "image": "path", "question": "..."}`` (or ``"images":
[...]``); paths are relative to the JSONL file. Each example runs ``num_samples`` times (selection seed
``seed + row * num_samples + sample``). Output, in a new or empty folder:

- ``settings.json``: the arguments, model, format, library, candidate token ids, system prompt digest;
- ``system_prompt.txt``;
- ``example_0001_sample_001/``: ``turns.jsonl`` (one line per turn), ``trajectory.json`` (the run, the
  final context text and the image registry when run in process), ``profiling.json``;
- ``profiling.json``: every trajectory's totals and the summary (per-turn reasoning and action latency
  mean/p95, model time per question mean/p95, tokens, outcomes).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ssr_server.agent.loop import RunOptions
from ssr_server.batch.runner import Job, Result, Runner, run_jobs, with_seed
from ssr_server.core.errors import InvalidRequest
from ssr_server.core.summary import forwards_line, percentiles


@dataclass(frozen=True)
class Example:
    id: str
    question: str
    images: tuple[Path, ...]


def read_examples(path: Path) -> list[Example]:
    """The JSONL rows, checked: a bad line is an ``InvalidRequest`` naming the file and line."""
    out: list[Example] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"{path}: cannot read: {exc}") from None
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise InvalidRequest(f"{path}:{n}: not valid JSON") from None
        question = row.get("question") if isinstance(row, dict) else None
        raw = row.get("images", [row.get("image")] if "image" in row else []) if isinstance(row, dict) else []
        if not isinstance(question, str) or not question.strip() or not isinstance(raw, list) \
                or not all(isinstance(p, str) for p in raw):
            raise InvalidRequest(f"{path}:{n}: needs a non-empty 'question' and an 'image' path "
                                 "(or 'images')")
        images = tuple((path.parent / p).resolve() for p in raw)
        missing = [str(p) for p in images if not p.is_file()]
        if missing:
            raise InvalidRequest(f"{path}:{n}: image not found: {missing[0]}")
        out.append(Example(str(row.get("id", f"row{n}")), question, images))
    if not out:
        raise InvalidRequest(f"{path}: no examples")
    return out


def jobs_for(examples: Sequence[Example], options: RunOptions, num_samples: int, seed: int) -> list[Job]:
    jobs = []
    for r, ex in enumerate(examples):
        for s in range(num_samples):
            jobs.append(Job(f"example_{r + 1:04}_sample_{s + 1:03}", ex.question, ex.images,
                            with_seed(options, seed + r * num_samples + s),
                            meta={"id": ex.id, "sample": s + 1}))
    return jobs


def write_json(path: Path, data: Any) -> None:
    """Atomically: a crash mid-write never leaves half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=1)
    os.replace(tmp, path)


def trajectory_totals(run: dict[str, Any]) -> dict[str, Any]:
    turns = run["turns"]
    return {
        "outcome": run["outcome"], "turns": len(turns),
        "reasoning_s": sum(t["reasoning_s"] for t in turns), "action_s": sum(t["action_s"] for t in turns),
        "tool_s": sum(t["tool_s"] for t in turns),
        "model_s": sum(t["reasoning_s"] + t["action_s"] for t in turns),
        "generated_tokens": sum(t["reasoning_tokens"] + t["action_tokens"] for t in turns),
        "scored_tokens": sum(t["scored_tokens"] for t in turns),
        "final_context_tokens": (run.get("usage") or {}).get("prompt_tokens", run.get("prompt_tokens")),
    }


def summarize(results: Sequence[Result]) -> dict[str, Any]:
    """Per-turn reasoning and action latency, model time per question, tokens, outcomes (seconds)."""
    runs = [r.run for r in results if r.run is not None]
    turns = [t for run in runs for t in run["turns"]]
    totals = [trajectory_totals(run) for run in runs]
    outcomes: dict[str, int] = {}
    for run in runs:
        outcomes[run["outcome"]] = outcomes.get(run["outcome"], 0) + 1
    return {
        "trajectories": len(results), "failed": sum(1 for r in results if r.error), "turns": len(turns),
        "outcomes": outcomes,
        "reasoning_s": percentiles(t["reasoning_s"] for t in turns),
        "action_s": percentiles(t["action_s"] for t in turns),
        "model_s_per_question": percentiles(t["model_s"] for t in totals),
        "turns_per_question": percentiles(t["turns"] for t in totals),
        "generated_tokens_per_question": percentiles(t["generated_tokens"] for t in totals),
        "scored_tokens_per_question": percentiles(t["scored_tokens"] for t in totals),
        "action_tokens": sum(t["action_tokens"] for t in turns),
        "action_forwards": sum(t.get("action_forwards", 0) for t in turns),
        "actions": sum(1 for t in turns if t.get("action_type")),
    }


def format_summary(s: dict[str, Any]) -> str:
    def ms(d: dict[str, Any]) -> str:
        return "-" if d["mean"] is None else f"mean {d['mean'] * 1e3:.1f} ms, p95 {d['p95'] * 1e3:.1f} ms"

    gen = s["generated_tokens_per_question"]
    return "\n".join([
        f"trajectories {s['trajectories']} ({s['failed']} failed), turns {s['turns']}, "
        f"outcomes {s['outcomes']}",
        f"reasoning per turn: {ms(s['reasoning_s'])}",
        f"action per turn:    {ms(s['action_s'])}",
        f"model time per question: {ms(s['model_s_per_question'])}",
        f"generated tokens per question: mean {gen['mean'] or 0:.1f}",
        f"actions: {forwards_line(s['actions'], s['action_tokens'], s['action_forwards'])}",
    ])



def prepare_output(out: Path, settings: dict[str, Any], system_prompt: str | None) -> None:
    """A new or empty folder holding the settings (and the system prompt when known)."""
    if out.exists() and any(out.iterdir()):
        raise InvalidRequest(f"output folder {out} must be new or empty")
    out.mkdir(parents=True, exist_ok=True)
    if system_prompt is not None:
        (out / "system_prompt.txt").write_text(system_prompt, encoding="utf-8")
        settings = {**settings, "system_prompt_sha256": hashlib.sha256(system_prompt.encode()).hexdigest()}
    write_json(out / "settings.json", settings)


async def infer(examples: Sequence[Example], runner: Runner, out: Path, options: RunOptions, *,
                num_samples: int, seed: int, concurrency: int, progress: bool = True) -> dict[str, Any]:
    """Run every sample into ``out`` (see ``prepare_output``), writing each trajectory as it finishes;
    returns the run profile."""
    profiles: list[dict[str, Any]] = []

    def save(res: Result) -> None:
        folder = out / res.job.key
        folder.mkdir()
        inputs = {"question": res.job.question, "images": [str(p) for p in res.job.images], **res.job.meta}
        record: dict[str, Any] = {"input": inputs, "seed": res.job.options.seed}
        if res.run is None:
            record.update(status="failed", error=res.error)
        else:
            with (folder / "turns.jsonl").open("w", encoding="utf-8") as f:
                for t in res.run["turns"]:
                    f.write(json.dumps(t, ensure_ascii=False) + "\n")
            record.update(status=res.run["outcome"], run=res.run, context_text=res.context_text,
                          images=res.images)
            profile = {"key": res.job.key, **trajectory_totals(res.run)}
            write_json(folder / "profiling.json", profile)
            profiles.append(profile)
        write_json(folder / "trajectory.json", record)

    results = await run_jobs(jobs_for(examples, options, num_samples, seed), runner, concurrency,
                             progress=progress, on_result=save, description="infer")
    profile = {"summary": summarize(results), "trajectories": sorted(profiles, key=lambda p: p["key"])}
    write_json(out / "profiling.json", profile)
    return profile

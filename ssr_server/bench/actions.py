"""``ssr-server bench actions``: where a turn's action time goes, and what drafts save.

The split's questions run through the real agent loop on one embedded engine, once per setting, side by
side: drafts off (one token per decode forward: plain greedy decoding) and on (jump-forward and prompt
lookup, ``speculate.py``), in alternating rounds. The prefix cache is emptied before each pass so that
neither inherits the other's contexts, and a warm-up pass runs first. Every generation the engine
returns is recorded with its breakdown (``Generation.timings``): the queue, the prefill of the prompt
and its forced opening, decode forwards, grammar work, sampling, drafting, detokenising, and the rest
(waiting on other jobs' work in the scheduler's loop). Both passes must write the same text at every
turn: the bench checks it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ssr_server.agent.loop import Agent, RunOptions
from ssr_server.batch.runner import Job, LocalRunner, Result, run_jobs
from ssr_server.bench.report import write_json
from ssr_server.core.actions import ALL_ACTIONS
from ssr_server.core.protocol import Context, Generation, GenerationParams
from ssr_server.core.summary import percentiles
from ssr_server.tools.demo import DemoWorld

PARTS = ("queue_s", "prefill_s", "forward_s", "grammar_s", "sample_s", "draft_s", "detok_s")


@dataclass
class Recorder:
    """The engine, with every generation it returns recorded (and what it was for)."""

    engine: Any
    kind_of: Callable[[GenerationParams], str]
    records: list[tuple[str, Generation]] = field(default_factory=list)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    async def generate(self, context: Context, params: GenerationParams) -> Generation:
        gen: Generation = await self.engine.generate(context, params)
        self.records.append((self.kind_of(params), gen))
        return gen


def _kinds(agent: Agent) -> Callable[[GenerationParams], str]:
    by_source: dict[str, str] = {}
    for action in ALL_ACTIONS:
        for n in range(0, 5):
            try:
                by_source[agent.turns.choice(action, n).grammar.source] = action
            except ValueError:  # an image move without an image
                continue

    def kind_of(params: GenerationParams) -> str:
        if params.grammar is None:
            return "reasoning"
        return by_source.get(params.grammar.source, "tool")

    return kind_of


def set_drafts(engine: Any, on: bool) -> None:
    """Drafts on (the engine's configuration) or off, on a running embedded engine."""
    from ssr_server.engine.torch.speculate import DraftConfig

    engine.scheduler.drafter.config = DraftConfig.of(engine.config, on)


def load_questions(world: Path, split: str, limit: int | None, pictures: bool = True) -> list[Job]:
    """The split's first ``limit`` questions, each with its picture (``pictures``) or as text alone (for
    a model that takes no images)."""
    qs = [q for q in DemoWorld(world).questions() if q.split == split]
    return [Job(q.id, q.question, (world / q.image,) if pictures else (), RunOptions(), {"answer": q.answer})
            for q in qs[:limit]]


def _ms(xs: Sequence[float]) -> dict[str, float | None]:
    p = percentiles([x * 1e3 for x in xs], (50, 95))
    return {"mean": p["mean"], "p50": p["p50"], "p95": p["p95"]}


def _summary(results: list[Result], records: list[tuple[str, Generation]]) -> dict[str, Any]:
    turns = [t for r in results if r.run for t in r.run["turns"]]
    gens = [g for k, g in records if k != "reasoning"]
    by_kind: dict[str, Any] = {}
    for kind in sorted({k for k, _ in records}):
        mine = [g for k, g in records if k == kind]
        tokens = sum(len(g.token_ids) for g in mine)
        forwards = sum(g.forwards for g in mine)
        by_kind[kind] = {"n": len(mine), "tokens_per_call": tokens / len(mine),
                         "forwards_per_call": forwards / len(mine),
                         "tokens_per_forward": tokens / forwards if forwards else None,
                         "ms": _ms([g.elapsed_s for g in mine])}
    parts = {p: sum(g.timings.get(p, 0.0) for g in gens) / max(1, len(gens)) * 1e3 for p in PARTS}
    total = sum((g.timings.get("queue_s", 0.0) + g.timings.get("prefill_s", 0.0) + g.elapsed_s)
                for g in gens) / max(1, len(gens)) * 1e3
    parts["other_s"] = total - sum(parts.values())
    drafted = sum(g.timings.get("drafted", 0.0) for g in gens)
    accepted = sum(g.timings.get("accepted", 0.0) for g in gens)
    runs = [r.run for r in results if r.run]
    errors = [r.error for r in results if r.error]
    return {
        "questions": len(results), "failed": len(errors), "first_error": errors[0] if errors else None,
        "turns": len(turns),
        "answered": sum(1 for r in runs if r["outcome"] == "answered"),
        "action_ms_per_turn": _ms([t["action_s"] for t in turns]),
        "reasoning_ms_per_turn": _ms([t["reasoning_s"] for t in turns]),
        "model_ms_per_question": _ms([r["model_s"] for r in runs]),
        "actions": len(gens),
        "tokens_per_action": sum(len(g.token_ids) for g in gens) / max(1, len(gens)),
        "forwards_per_action": sum(g.forwards for g in gens) / max(1, len(gens)),
        "draft_acceptance": accepted / drafted if drafted else None,
        "action_breakdown_ms": {k.removesuffix("_s"): v for k, v in parts.items()},
        "by_kind": by_kind,
    }


def _texts(results: list[Result]) -> dict[str, list[tuple[Any, ...]]]:
    return {r.job.key: [(t["candidate_id"], t["reasoning"], t["action_text"]) for t in r.run["turns"]]
            + [("answer", r.run["answer"])] for r in results if r.run}


async def _pass(agent: Agent, rec: Recorder, jobs: list[Job], concurrency: int, on: bool,
                mode: str) -> tuple[list[Result], list[tuple[str, Generation]]]:
    set_drafts(rec.engine, on)
    rec.engine.prefix_cache.clear()
    rec.records = []
    jobs = [Job(j.key, j.question, j.images, RunOptions(mode=mode), j.meta) for j in jobs]
    results = await run_jobs(jobs, LocalRunner(agent), concurrency, progress=False)
    return results, rec.records


async def run_actions_bench(agent: Agent, jobs: list[Job], *, concurrency: int = 4,
                            modes: Sequence[str] = ("ssr", "freeform"), repeats: int = 1) -> dict[str, Any]:
    """Each mode's questions with drafts off and on, on one engine, a warm-up first. The questions go
    in rounds of ``concurrency``, each round once per setting (which goes first alternates), so
    that both settings meet the same machine load, even on a busy machine; the whole split
    ``repeats`` times (the ratios of each repeat are reported too: how much the machine moved them)."""
    rec = Recorder(agent.engine, _kinds(agent))
    bench = Agent(rec, agent.tools, agent.libraries, agent.format)  # type: ignore[arg-type]
    await _pass(bench, rec, jobs[: max(1, concurrency)], concurrency, True, modes[0])
    out: dict[str, Any] = {"concurrency": concurrency, "questions": len(jobs), "modes": {}}
    for mode in modes:
        got: dict[str, tuple[list[Result], list[tuple[str, Generation]], float]] = {
            "off": ([], [], 0.0), "on": ([], [], 0.0)}
        per_repeat: list[dict[str, float | None]] = []
        r = 0
        for _ in range(repeats):
            mine: dict[str, list[Result]] = {"off": [], "on": []}
            for start in range(0, len(jobs), concurrency):
                order = (("off", False), ("on", True)) if r % 2 == 0 else (("on", True), ("off", False))
                r += 1
                for name, on in order:
                    t0 = time.perf_counter()
                    results, records = await _pass(bench, rec, jobs[start : start + concurrency],
                                                   concurrency, on, mode)
                    res, recs, wall = got[name]
                    got[name] = (res + results, recs + records, wall + time.perf_counter() - t0)
                    mine[name] += results
            per_repeat.append(_action_ratios(mine["off"], mine["on"]))
        passes: dict[str, Any] = {name: {**_summary(res, recs), "wall_s": wall}
                                  for name, (res, recs, wall) in got.items()}
        texts = {name: _texts(res) for name, (res, _, _) in got.items()}
        turns_off = [t for turns in texts["off"].values() for t in turns]
        same = sum(1 for key, turns in texts["off"].items() for i, t in enumerate(turns)
                   if i < len(texts["on"].get(key, [])) and texts["on"][key][i] == t)
        off, on = passes["off"], passes["on"]
        passes["identical_turns"] = {"same": same, "of": len(turns_off)}
        passes["repeats"] = per_repeat
        passes["ratios"] = {
            "forwards_per_action": _ratio(off["forwards_per_action"], on["forwards_per_action"]),
            "action_ms_mean": _ratio(off["action_ms_per_turn"]["mean"], on["action_ms_per_turn"]["mean"]),
            "action_ms_p95": _ratio(off["action_ms_per_turn"]["p95"], on["action_ms_per_turn"]["p95"]),
            "model_ms_per_question": _ratio(off["model_ms_per_question"]["mean"],
                                            on["model_ms_per_question"]["mean"]),
        }
        out["modes"][mode] = passes
    if "ssr" in out["modes"] and "freeform" in out["modes"]:
        s = out["modes"]["ssr"]["on"]["model_ms_per_question"]["mean"]
        f = out["modes"]["freeform"]["on"]["model_ms_per_question"]["mean"]
        out["ssr_over_freeform_model_time"] = s / f if s and f else None
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _action_ratios(off: list[Result], on: list[Result]) -> dict[str, float | None]:
    """Action ms off/on (mean, p95) of one repeat's turns."""
    a, b = (_ms([t["action_s"] for r in rs if r.run for t in r.run["turns"]]) for rs in (off, on))
    return {"action_ms_mean": _ratio(a["mean"], b["mean"]), "action_ms_p95": _ratio(a["p95"], b["p95"])}


def run(agent: Agent, world: Path, split: str, limit: int | None, concurrency: int, modes: Sequence[str],
        json_path: Path | None, repeats: int = 1) -> dict[str, Any]:
    # a text-only model (no image token) gets the questions as text: its runs search text and answer
    pictures = getattr(agent.engine, "image_token_id", None) is not None
    jobs = load_questions(world, split, limit, pictures)
    if not jobs:
        raise ValueError(f"no {split!r} questions in {world}")
    result = asyncio.run(run_actions_bench(agent, jobs, concurrency=concurrency, modes=modes,
                                           repeats=repeats))
    result.update(world=str(world), split=split, pictures=pictures)
    if json_path is not None:
        write_json(json_path, result)
    return result


def failed(r: dict[str, Any]) -> int:
    """Runs that failed, over every mode and setting (their turns are missing from the figures)."""
    return sum(p[name]["failed"] for p in r["modes"].values() for name in ("off", "on"))


def format_table(r: dict[str, Any]) -> str:
    def f(x: Any, spec: str = ".1f") -> str:
        return "-" if x is None else format(x, spec)

    lines = [f"{r['questions']} {r['split']} questions of {r['world']}"
             f"{'' if r.get('pictures', True) else ' (text only: the model takes no images)'}, "
             f"{r['concurrency']} at a time; drafts off = one token per decode forward"]
    for mode, p in r["modes"].items():
        lines.append(f"\n[{mode}]  identical turns off vs on: {p['identical_turns']['same']}/"
                     f"{p['identical_turns']['of']}")
        for name in ("off", "on"):
            if p[name]["failed"]:
                lines.append(f"FAILED runs, drafts {name}: {p[name]['failed']} of {p[name]['questions']} "
                             f"(first: {p[name]['first_error']})")
        lines.append(f"{'':28}{'off':>10}{'on':>10}{'off/on':>9}")
        off, on, ra = p["off"], p["on"], p["ratios"]
        rows = [("action ms/turn, mean", off["action_ms_per_turn"]["mean"], on["action_ms_per_turn"]["mean"],
                 ra["action_ms_mean"]),
                ("action ms/turn, p95", off["action_ms_per_turn"]["p95"], on["action_ms_per_turn"]["p95"],
                 ra["action_ms_p95"]),
                ("reasoning ms/turn, mean", off["reasoning_ms_per_turn"]["mean"],
                 on["reasoning_ms_per_turn"]["mean"], None),
                ("model ms/question, mean", off["model_ms_per_question"]["mean"],
                 on["model_ms_per_question"]["mean"], ra["model_ms_per_question"]),
                ("tokens per action", off["tokens_per_action"], on["tokens_per_action"], None),
                ("decode forwards per action", off["forwards_per_action"], on["forwards_per_action"],
                 ra["forwards_per_action"])]
        for name, a, b, x in rows:
            lines.append(f"{name:28}{f(a):>10}{f(b):>10}{f(x, '.2f'):>9}")
        lines.append(f"{'draft acceptance':28}{'':>10}{f(on['draft_acceptance'], '.0%'):>10}")
        if len(p["repeats"]) > 1:
            for key, what in (("action_ms_mean", "mean"), ("action_ms_p95", "p95")):
                xs = sorted(x[key] for x in p["repeats"] if x[key] is not None)
                lines.append(f"action ms off/on, {what}, each repeat: " + " ".join(f"{x:.2f}" for x in xs))
        lines.append("action time per call, ms (mean):  " + "  ".join(
            f"{k} {f(off['action_breakdown_ms'][k])}/{f(on['action_breakdown_ms'][k])}"
            for k in off["action_breakdown_ms"]))
        lines.append(f"{'by kind (off | on)':28}{'calls':>6}{'tokens':>8}{'fwd off':>9}{'fwd on':>8}"
                     f"{'tok/fwd on':>11}{'ms off':>8}{'ms on':>8}")
        for kind, k_off in off["by_kind"].items():
            k_on = on["by_kind"].get(kind, {})
            lines.append(f"{kind:28}{k_off['n']:>6}{f(k_off['tokens_per_call']):>8}"
                         f"{f(k_off['forwards_per_call']):>9}{f(k_on.get('forwards_per_call')):>8}"
                         f"{f(k_on.get('tokens_per_forward'), '.2f'):>11}{f(k_off['ms']['mean']):>8}"
                         f"{f(k_on.get('ms', {}).get('mean')):>8}")
    if r.get("ssr_over_freeform_model_time") is not None:
        lines.append(f"\nSSR model time per question / freeform's (both with drafts): "
                     f"{r['ssr_over_freeform_model_time']:.2f} (the paper: 0.46)")
    return "\n".join(lines)

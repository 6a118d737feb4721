"""``ssr-server bench router``: two real SGLang CPU workers behind SGLang's router, ssr-server in front.

Side by side in one run, on the same two workers (caches flushed before each level):
- per routing policy (``cache_aware``, ``round_robin``, ``manual`` with ssr-server's routing key) and
  level of concurrent runs: every scored row's ``cached_tokens`` against its context length P (the
  share with ``cached >= P - 1``: the context came from the worker's radix cache), reasoning and turn
  latency, and how the router spread the requests;
- ``ssr-lab eval --server`` through the router against ``ssr-lab eval`` on the embedded engine, on the
  same test questions of a world built for it: the same predictions and choices?
- a worker SIGKILLed while 8 runs are in flight: each run's HTTP status and outcome (none may hang or
  get a 5xx other than a JSON 503), new runs after the router's health checks, then the second worker
  killed: ssr-server's ``/ready`` and a new run's answer, and the runs the agent's metrics counted.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from ssr_server.bench.report import write_json
from ssr_server.bench.router_harness import RouterHarness
from ssr_server.bench.serve import live_server
from ssr_server.core.protocol import CandidateScore, Context
from ssr_server.core.summary import percentiles
from ssr_server.engine.sglang.client import SGLangEngine
from ssr_server.tools.demo import shipped_demo_world

# manual: the router sends each routing key (ssr-server's: the conversation's root) to one worker
POLICIES = ("cache_aware", "round_robin", "manual")


class RecordingSGLangEngine(SGLangEngine):
    """The SGLang client, keeping every scored row's (context length, cached tokens)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rows: list[tuple[int, int]] = []

    async def score(self, context: Context, candidates: Sequence[Sequence[int]]) -> list[CandidateScore]:
        scores = await super().score(context, candidates)
        self.rows.extend((s.context_tokens, s.cached_tokens) for s in scores)
        return scores


def router_settings(router_url: str, model: str, **extra: Any) -> Any:
    from ssr_server.core.config import Settings

    return Settings(engine="sglang", sglang_url=router_url, sglang_scoring="generate", model=model,
                    max_concurrent_runs=16, run_store="off", **extra)


def demo_bodies(n: int, max_turns: int = 6) -> list[dict[str, Any]]:
    """``n`` run requests: the demo world's test questions (then its dev ones), each with its image."""
    world = shipped_demo_world()
    qs = sorted((q for q in world.questions() if q.split in ("test", "dev")), key=lambda q: q.split != "test")
    return [{"question": q.question, "max_turns": max_turns, "seed": i,
             "images": [base64.b64encode((world.root / q.image).read_bytes()).decode()]}
            for i, q in enumerate(qs[i % len(qs)] for i in range(n))]


async def post_runs(url: str, bodies: Sequence[dict[str, Any]], concurrency: int,
                    timeout_s: float = 180.0) -> list[dict[str, Any]]:
    """Every body through ``POST /v1/agent/runs``; per run its status, outcome, error code and turns
    (a run with no answer within ``timeout_s`` is recorded as hung)."""
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s, trust_env=False) as client:
        async def one(body: dict[str, Any]) -> dict[str, Any]:
            async with gate:
                t0 = time.perf_counter()
                try:
                    resp = await client.post("/v1/agent/runs", json=body)
                except httpx.TimeoutException:
                    return {"status": None, "hung": True, "s": time.perf_counter() - t0}
                out: dict[str, Any] = {"status": resp.status_code, "hung": False,
                                       "s": time.perf_counter() - t0}
                try:
                    data = resp.json()
                except ValueError:
                    return {**out, "json": False}
                out["json"] = True
                if resp.status_code == 200:
                    out.update(outcome=data["outcome"], error=data.get("error"),
                               turns=[(t["reasoning_s"], t["turn_s"]) for t in data["turns"]])
                else:
                    out["error"] = (data.get("error") or {}).get("code") if isinstance(data, dict) else None
                    out["message"] = ((data.get("error") or {}).get("message") if isinstance(data, dict)
                                      else None)
                return out

        return list(await asyncio.gather(*(one(b) for b in bodies)))


def measure_level(h: RouterHarness, model: str, runs: int, concurrency: int) -> dict[str, Any]:
    h.flush_workers()
    before = h.requests_by_worker()
    engine = RecordingSGLangEngine(h.url, model=model, scoring="generate")
    t0 = time.perf_counter()
    with live_server(router_settings(h.url, model), engine=engine) as url:
        results = asyncio.run(post_runs(url, demo_bodies(runs), concurrency))
    wall = time.perf_counter() - t0
    after = h.requests_by_worker()
    rows = engine.rows
    hit = sum(1 for p, c in rows if c >= p - 1)
    spread = {str(p): after[p] - before[p] for p in h.workers}
    turns = [t for r in results for t in r.get("turns", ())]
    reasoning, turn = percentiles(t[0] for t in turns), percentiles(t[1] for t in turns)
    return {
        "policy": h.policy, "concurrency": concurrency, "runs": runs, "wall_s": wall,
        "answered": sum(1 for r in results if r.get("outcome") == "answered"),
        "failed": sum(1 for r in results if r["status"] != 200),
        "rows": len(rows), "rows_cached": hit, "cached_share": hit / len(rows) if rows else None,
        "mean_cached_fraction": (sum(min(c, p) / p for p, c in rows if p) / len(rows)) if rows else None,
        "reasoning_mean_s": reasoning["mean"], "reasoning_p95_s": reasoning["p95"],
        "turn_mean_s": turn["mean"], "turn_p95_s": turn["p95"], "turns": len(turns),
        "requests_by_worker": spread, "resent": engine.calls["resent"],
    }


def _lab_cli() -> Path | None:
    exe = Path(sys.executable).with_name("ssr-lab")
    return exe if exe.is_file() else None


def measure_eval(h: RouterHarness, model: str, questions: int, world: Path | None,
                 workdir: Path) -> dict[str, Any]:
    """``ssr-lab eval`` (the lab's own evaluation, unchanged) through ssr-server on the router, and on the
    embedded engine in process, on the same test questions; per question, the same prediction and the
    same chosen rationales and actions?"""
    lab = _lab_cli()
    if lab is None:
        return {"skipped": "ssr-lab is not installed (the [lab] extra): no eval through the router"}
    if world is None:
        world = workdir / "world"
        # 300 entities give about 150 test questions (the shipped demo world has 19)
        subprocess.run([str(lab), "world", "build", str(world), "--entities", "300", "--processes", "2"],
                       check=True, stdout=subprocess.DEVNULL)
    h.flush_workers()
    common = ["eval", "--world", str(world), "--model", model, "--split", "test", "--limit", str(questions),
              "--concurrency", "4"]
    engine = SGLangEngine(h.url, model=model, scoring="generate")
    settings = router_settings(h.url, model, corpus_path=str(world / "corpus.jsonl"),
                         image_index_dir=str(world / "images"))
    t0 = time.perf_counter()
    with live_server(settings, engine=engine) as url:
        subprocess.run([str(lab), *common, "--server", url, "--json", str(workdir / "router.json")],
                       check=True, stdout=subprocess.DEVNULL)
    router_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    subprocess.run([str(lab), *common, "--json", str(workdir / "embedded.json")], check=True,
                   stdout=subprocess.DEVNULL, env={**os.environ, "SSR_TORCH_THREADS": "1"})
    embedded_s = time.perf_counter() - t0
    a, b = ({r["id"]: r for r in json.loads((workdir / f).read_text())["records"]}
            for f in ("router.json", "embedded.json"))
    same_pred = [q for q in a if q in b and a[q]["prediction"] == b[q]["prediction"]]
    same_choice = [q for q in a if q in b
                   and (a[q]["chosen"], a[q]["actions"]) == (b[q]["chosen"], b[q]["actions"])]
    return {
        "world": str(world), "files": str(workdir), "questions": len(a), "same_prediction": len(same_pred),
        "same_choices": len(same_choice),
        "differ": sorted((set(a) - set(same_pred)) | (set(a) - set(same_choice))),
        "router_failed": sum(1 for r in a.values() if r["outcome"] == "failed"),
        "router_correct": sum(1 for r in a.values() if r["correct"]),
        "embedded_correct": sum(1 for r in b.values() if r["correct"]),
        "router_s": router_s, "embedded_s": embedded_s,
    }


def _runs_by_outcome(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=10, trust_env=False).text
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name == "ssr_runs":
            for s in fam.samples:
                if s.name == "ssr_runs_total":
                    out[s.labels["outcome"]] = out.get(s.labels["outcome"], 0.0) + s.value
    return out


def _delta(a: dict[str, float], b: dict[str, float]) -> dict[str, int]:
    return {k: int(b.get(k, 0) - a.get(k, 0)) for k in sorted(set(a) | set(b)) if b.get(k, 0) != a.get(k, 0)}


def measure_worker_loss(h: RouterHarness, model: str, in_flight: int = 8) -> dict[str, Any]:
    """SIGKILL the worker serving while ``in_flight`` runs are running; then the second one."""
    engine = SGLangEngine(h.url, model=model, scoring="generate")
    with live_server(router_settings(h.url, model), engine=engine) as url:
        return asyncio.run(_worker_loss(h, url, engine, in_flight))


async def _worker_loss(h: RouterHarness, url: str, engine: SGLangEngine, in_flight: int) -> dict[str, Any]:
    out: dict[str, Any] = {"in_flight": in_flight}
    m0 = await asyncio.to_thread(_runs_by_outcome, url)
    before = await asyncio.to_thread(h.requests_by_worker)
    task = asyncio.create_task(post_runs(url, demo_bodies(in_flight), in_flight))
    async with httpx.AsyncClient(base_url=url, timeout=10, trust_env=False) as client:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not task.done():
            ready = (await client.get("/ready")).json()
            if ready["runs_in_flight"] >= in_flight:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # past the first turn's scoring
        mid = await asyncio.to_thread(h.requests_by_worker)
        victim = max(h.workers, key=lambda p: mid[p] - before[p])
        survivor = next(p for p in h.workers if p != victim)
        out["runs_in_flight_at_kill"] = (await client.get("/ready")).json()["runs_in_flight"]
        t_kill = time.monotonic()
        await asyncio.to_thread(h.kill_worker, victim)
        out["router_dropped_worker_s"] = await asyncio.to_thread(h.wait_healthy, 1, 60)
        results = await task
        out["runs"] = _summary(results)
        out["all_runs_done_s"] = time.monotonic() - t_kill
        out["resent_in_flight"] = engine.calls["resent"]
        # new runs once the router has dropped the worker: all on the survivor
        b2 = await asyncio.to_thread(h.requests_by_worker)
        out["after"] = _summary(await post_runs(url, demo_bodies(4), 4))
        a2 = await asyncio.to_thread(h.requests_by_worker)
        out["after_requests"] = {"killed": a2[victim] - b2[victim], "survivor": a2[survivor] - b2[survivor]}
        # no worker left: /ready and a new run
        await asyncio.to_thread(h.kill_worker, survivor)
        t0 = time.monotonic()
        status, body = 200, {}
        while time.monotonic() - t0 < 60:
            resp = await client.get("/ready")
            status, body = resp.status_code, resp.json()
            if status == 503:
                break
            await asyncio.sleep(0.2)
        out["ready_503_after_s"] = time.monotonic() - t0 if status == 503 else None
        out["ready_body"] = body
        out["no_worker_run"] = (await post_runs(url, demo_bodies(1), 1))[0]
    out["runs_by_outcome"] = _delta(m0, await asyncio.to_thread(_runs_by_outcome, url))
    out["resent"] = engine.calls["resent"]
    return out


def _summary(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    statuses: dict[str, int] = {}
    outcomes: dict[str, int] = {}
    for r in results:
        statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1
        key = r.get("outcome") or r.get("error") or "none"
        outcomes[key] = outcomes.get(key, 0) + 1
    return {"runs": len(results), "statuses": statuses, "outcomes": outcomes,
            "hung": sum(1 for r in results if r["hung"]),
            "bad_5xx": sum(1 for r in results if (r["status"] or 0) >= 500
                           and not (r["status"] == 503 and r.get("json"))),
            "errors": sorted({str(r.get("message") or r.get("error")) for r in results
                              if r["status"] != 200 or r.get("outcome") != "answered"})[:5]}


def run_router_bench(model: str | None = None, runs: int = 16, concurrencies: Sequence[int] = (1, 8),
                     policies: Sequence[str] = POLICIES, eval_questions: int = 120,
                     world: Path | None = None, worker_loss: bool = True,
                     json_path: str | None = None) -> dict[str, Any]:
    from ssr_server.core.config import Settings
    from ssr_server.engine.factory import resolve_model

    model = model or resolve_model(Settings())
    h = RouterHarness(model=model, policy=policies[0])
    h.venvs()
    result: dict[str, Any] = {"model": model, "workers": 2, "router": "sglang-router 0.3.2",
                              "health_check": "every 2 s, 2 failures, 20 s timeout", "levels": []}
    h.up()
    try:
        for i, policy in enumerate(policies):
            if i:
                h.restart_router(policy)
            for c in concurrencies:
                result["levels"].append(measure_level(h, model, runs, c))
        if policies[-1] != "manual":  # the eval and the worker loss on the policy the docs recommend
            h.restart_router("manual")
        if eval_questions > 0:  # the two eval files (and the world built) are kept for a look
            result["eval"] = measure_eval(h, model, eval_questions, world,
                                          Path(tempfile.mkdtemp(prefix="ssr-router-bench-")))
        if worker_loss:
            result["worker_loss"] = measure_worker_loss(h, model)
    finally:
        h.down()
    if json_path:
        write_json(json_path, result)
    return result


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


def format_table(res: dict[str, Any]) -> str:
    lines = [f"router bench: {res['model']}, 2 SGLang CPU workers, {res['router']}, health checks "
             f"{res['health_check']}",
             f"{'policy':<12} {'conc':>4} {'runs':>4} {'rows':>5} {'cached>=P-1':>11} {'reason ms':>10} "
             f"{'p95':>6} {'turn ms':>8} {'p95':>6}  requests per worker"]
    for lv in res["levels"]:
        share = "-" if lv["cached_share"] is None else f"{lv['cached_share'] * 100:.1f}%"
        lines.append(f"{lv['policy']:<12} {lv['concurrency']:>4} {lv['runs']:>4} {lv['rows']:>5} {share:>11} "
                     f"{_ms(lv['reasoning_mean_s']):>10} {_ms(lv['reasoning_p95_s']):>6} "
                     f"{_ms(lv['turn_mean_s']):>8} {_ms(lv['turn_p95_s']):>6}  "
                     f"{' / '.join(str(v) for v in lv['requests_by_worker'].values())}"
                     + (f"  ({lv['failed']} failed)" if lv["failed"] else ""))
    ev = res.get("eval")
    if ev and "skipped" in ev:
        lines.append(f"eval: skipped ({ev['skipped']})")
    elif ev:
        lines.append(f"eval through the router vs embedded, {ev['questions']} test questions: same "
                     f"prediction {ev['same_prediction']}/{ev['questions']}, same choices "
                     f"{ev['same_choices']}/{ev['questions']}; correct {ev['router_correct']} vs "
                     f"{ev['embedded_correct']}; "
                     f"{ev['router_s']:.0f} s vs {ev['embedded_s']:.0f} s")
    wl = res.get("worker_loss")
    if wl:
        r = wl["runs"]
        lines.append(f"worker SIGKILLed under {wl['runs_in_flight_at_kill']} runs in flight: statuses "
                     f"{r['statuses']}, outcomes {r['outcomes']}, hung {r['hung']}, 5xx other than a JSON "
                     f"503 {r['bad_5xx']}; router dropped it after {_s(wl['router_dropped_worker_s'])} s; "
                     f"steps resent {wl['resent_in_flight']}")
        lines.append(f"  then 4 new runs: {wl['after']['statuses']}, requests killed/survivor "
                     f"{wl['after_requests']['killed']}/{wl['after_requests']['survivor']}; no worker left: "
                     f"/ready 503 after {_s(wl['ready_503_after_s'])} s, a new run -> "
                     f"{wl['no_worker_run']['status']} {wl['no_worker_run'].get('error')}; ssr_runs_total "
                     f"by outcome {wl['runs_by_outcome']}")
    return "\n".join(lines)

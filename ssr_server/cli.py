"""``ssr-server``: serve | ask | infer | eval | world | train | bench | tiny-model | sglang-launch |
loadtest."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer

MODEL_HELP = "model dir or hub id (default: the shipped trained model; tiny-random: the random tiny one)"
app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Inference server for small multimodal search agents that reason by selection.")
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks that print figures measured side by side.")
app.add_typer(bench_app, name="bench")


def _settings(**overrides: Any) -> Any:
    from ssr_server.config import Settings

    return Settings(**{k: v for k, v in overrides.items() if v is not None})


@app.command()
def serve(
    engine: Annotated[str | None, typer.Option(help="torch (embedded) or sglang")] = None,
    model: Annotated[str | None, typer.Option(help=MODEL_HELP)] = None,
    host: Annotated[str | None, typer.Option()] = None,
    port: Annotated[int | None, typer.Option()] = None,
    dtype: Annotated[str | None, typer.Option(help="fp32 | bf16 | fp16")] = None,
    sglang_url: Annotated[str | None, typer.Option()] = None,
    log_level: Annotated[str, typer.Option()] = "info",
) -> None:
    """Run the agent server (FastAPI on uvicorn). Settings also come from SSR_* variables.

    SIGTERM/SIGINT drains: the socket stays open (new runs get 503 shutting_down), runs in flight
    finish until SSR_DRAIN_TIMEOUT_S, what still runs then is cancelled (JSON 503); a second signal
    exits at once."""
    import logging

    import uvicorn

    from ssr_server.api.app import create_app, drain_app
    from ssr_server.api.shutdown import GRACEFUL_S, DrainingServer

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = _settings(engine=engine, model=model, host=host, port=port, dtype=dtype, sglang_url=sglang_url)
    application = create_app(settings)
    # The drain happens before uvicorn's own shutdown, whose graceful wait then only sees idle
    # connections: a short bound, not the drain timeout a second time.
    config = uvicorn.Config(application, host=settings.host, port=settings.port, log_level=log_level,
                            timeout_graceful_shutdown=GRACEFUL_S)
    DrainingServer(config, drain=lambda: drain_app(application)).run()


def _print_run(run: dict[str, Any]) -> None:
    print(f"question: {run['question']}")
    print(f"{'turn':>4} {'rationale / reasoning':<28} {'action':<13} {'argument':<28} "
          f"{'reason ms':>9} {'action ms':>9} {'tool ms':>8}")
    for t in run["turns"]:
        why = (t["candidate_id"] or t["reasoning"] or "").replace("\n", " ")[:28]
        arg = (t["argument"] or "").replace("\n", " ")[:28]
        print(f"{t['index']:>4} {why:<28} {t['action_type'] or '-':<13} {arg:<28} "
              f"{t['reasoning_s'] * 1e3:>9.1f} {t['action_s'] * 1e3:>9.1f} {t['tool_s'] * 1e3:>8.1f}")
        if t["observation"]:
            print(f"     -> {t['observation'][:100]!r}")
    timings = run.get("timings") or {k: run[k] for k in ("total_s", "model_s", "tool_s")}
    print(f"outcome: {run['outcome']}  answer: {run['answer']!r}")
    print(f"total {timings['total_s']:.3f} s, model {timings['model_s']:.3f} s, "
          f"tools {timings['tool_s']:.3f} s")


@app.command()
def ask(
    question: Annotated[str, typer.Option(help="the question")],
    image: Annotated[list[Path] | None, typer.Option(help="image file (repeatable)")] = None,
    model: Annotated[str | None, typer.Option(help=MODEL_HELP)] = None,
    server: Annotated[str | None, typer.Option(help="ask a running server instead (URL)")] = None,
    mode: Annotated[str, typer.Option(help="ssr | freeform")] = "ssr",
    library: Annotated[str, typer.Option()] = "default",
    tau: Annotated[float, typer.Option()] = 0.0,
    seed: Annotated[int | None, typer.Option()] = None,
    max_turns: Annotated[int, typer.Option()] = 6,
    as_json: Annotated[bool, typer.Option("--json", help="print the whole run as JSON")] = False,
    api_key: Annotated[str | None, typer.Option(envvar="SSR_API_KEY")] = None,
    expect_answer: Annotated[bool, typer.Option(help="exit 2 unless the run ends with an answer")] = False,
    gold: Annotated[list[str] | None, typer.Option(
        help="the right answer (repeatable: aliases); prints whether the run's answer matches it")] = None,
    expect_correct: Annotated[bool, typer.Option(
        help="with --gold: exit 3 unless the answer is right")] = False,
) -> None:
    """One run from the command line, in process or against a server."""
    import base64

    images = [p.read_bytes() for p in image or []]
    if server:
        import httpx

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        body = {"question": question, "images": [base64.b64encode(b).decode() for b in images],
                "mode": mode, "library": library, "tau": tau, "seed": seed, "max_turns": max_turns}
        resp = httpx.post(server.rstrip("/") + "/v1/agent/runs", json=body, headers=headers, timeout=600)
        if resp.status_code != 200:
            typer.echo(f"error {resp.status_code}: {resp.text}", err=True)
            raise typer.Exit(1)
        run = resp.json()
    else:
        run = asyncio.run(_ask_local(question, images, model, mode, library, tau, seed, max_turns))
    if as_json:
        print(json.dumps(run, indent=1))
    else:
        _print_run(run)
    if expect_answer and run["outcome"] != "answered":
        typer.echo(f"the run ended without an answer (outcome {run['outcome']})", err=True)
        raise typer.Exit(2)
    if gold:
        from ssr_server.world import is_correct

        right = run["answer"] is not None and is_correct(run["answer"], gold[0], gold[1:])
        print(f"correct: {'yes' if right else 'no'} (the right answer: {gold[0]})")
        if expect_correct and not right:
            raise typer.Exit(3)


async def _ask_local(question: str, images: list[bytes], model: str | None, mode: str, library: str,
                     tau: float, seed: int | None, max_turns: int) -> dict[str, Any]:
    from ssr_server.agent.loop import RunOptions
    from ssr_server.api.images import ImageLimits, decode_image_bytes

    agent = _local_agent(_settings(model=model))
    try:
        refs = [decode_image_bytes(b, ImageLimits()) for b in images]
        run = await agent.run(question, refs, RunOptions(mode=mode, library=library, tau=tau, seed=seed,
                                                         max_turns=max_turns))
        return dict(run.to_dict())
    finally:
        await agent.tools.aclose()
        await agent.engine.close()


@app.command("tiny-model")
def tiny_model(
    out_dir: Annotated[Path, typer.Argument(help="where to write the model")],
    seed: Annotated[int, typer.Option()] = 0,
    vocab: Annotated[str, typer.Option(help="trained (small BPE) | qwen (real Qwen vocabulary)")] = "trained",
) -> None:
    """Build the tiny random Qwen3-VL offline and deterministically."""
    from ssr_server.engine.tiny import build_tiny_model

    if vocab not in ("trained", "qwen"):
        raise typer.BadParameter("vocab must be 'trained' or 'qwen'")
    path = build_tiny_model(out_dir, seed=seed, vocab=vocab)  # type: ignore[arg-type]
    typer.echo(f"tiny Qwen3-VL written to {path}")


@app.command("sglang-launch", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def sglang_launch(ctx: typer.Context) -> None:
    """Start SGLang's server with our /ssr/score route (run inside SGLang's environment)."""
    from ssr_server.engine.sglang.server import main as launch

    launch(list(ctx.args))


@bench_app.command("scoring")
def bench_scoring(
    model: Annotated[str | None, typer.Option(help="model dir (default: the tiny VL model)")] = None,
    shape: Annotated[str | None, typer.Option(help="0.6b: a random Qwen3 of 0.6B shape in memory")] = None,
    dtype: Annotated[str, typer.Option(help="fp32 | bf16")] = "fp32",
    repeats: Annotated[int, typer.Option()] = 5,
    engine: Annotated[str, typer.Option(help="torch | sglang")] = "torch",
    sglang_url: Annotated[str | None, typer.Option()] = None,
    bf16_matmul: Annotated[str, typer.Option(help="auto | native | fp32 (bf16 matmul kernel)")] = "auto",
    json_path: Annotated[str | None, typer.Option("--json", help="write the figures as JSON")] = None,
) -> None:
    """Naive vs packed vs packed-on-cache scoring vs freeform decoding, side by side."""
    if engine == "sglang":
        from ssr_server.bench import sglang_scoring
        from ssr_server.engine.factory import resolve_model

        url = sglang_url or _settings().sglang_url
        res = sglang_scoring.run_sglang_scoring_bench(url, model or resolve_model(_settings()), repeats,
                                                      json_path)
        typer.echo(sglang_scoring.format_table(res))
        return
    from ssr_server.bench import scoring

    kwargs: dict[str, Any] = {"bf16_matmul": bf16_matmul}
    result = scoring.run_scoring_bench(model=model, shape=shape, dtype=dtype, repeats=repeats,
                                       json_path=json_path, engine=engine, **kwargs)
    typer.echo(scoring.format_table(result))


@bench_app.command("serve")
def bench_serve(
    model: Annotated[str | None, typer.Option(help="model dir (default: the offline tiny model)")] = None,
    concurrency: Annotated[list[int] | None, typer.Option(help="levels (repeatable)")] = None,
    runs: Annotated[int, typer.Option(help="runs per level")] = 32,
    max_turns: Annotated[int, typer.Option()] = 4,
    repeats: Annotated[int, typer.Option(help="repeat each level; the median is reported")] = 1,
    json_path: Annotated[str | None, typer.Option("--json", help="write the figures as JSON")] = None,
    mixed: Annotated[bool, typer.Option(help="also the mixed-load case (decoding during a prefill)")] = True,
    mixed_only: Annotated[bool, typer.Option(help="only the mixed-load case")] = False,
    warm_start: Annotated[bool, typer.Option(help="each level starts with the system prompt cached")] = False,
) -> None:
    """Runs/s and per-turn reasoning p95 at several concurrencies, one real server, side by side;
    inter-token latency of a decoding run while another run prefills a ~4,000-token context."""
    from ssr_server.bench import serve as serve_bench

    result = serve_bench.run_serve_bench(model=model, concurrencies=tuple(concurrency or (1, 4, 8)),
                                         runs_per_level=runs, max_turns=max_turns, json_path=json_path,
                                         repeats=repeats, mixed=mixed, mixed_only=mixed_only,
                                         warm_start=warm_start)
    typer.echo(serve_bench.format_table(result))


@bench_app.command("batching")
def bench_batching(
    model: Annotated[str | None, typer.Option(help="model dir (default: the offline tiny model)")] = None,
    concurrency: Annotated[list[int] | None, typer.Option(help="runs sharing a forward (repeatable)")] = None,
    past_tokens: Annotated[int, typer.Option(min=1, help="tokens of each run's cached context")] = 600,
    repeats: Annotated[int, typer.Option(min=1, help="forwards timed per point (median)")] = 9,
    json_path: Annotated[str | None, typer.Option("--json", help="write the figures as JSON")] = None,
) -> None:
    """How one forward's cost grows with the runs sharing it (decode steps, selections): embedded engine."""
    import asyncio

    from ssr_server.bench.batching import LEVELS, format_batching, run_batching_bench
    from ssr_server.engine.factory import resolve_model
    from ssr_server.engine.torch.config import EngineConfig
    from ssr_server.engine.torch.engine import TorchEngine

    settings = _settings(model=model)
    engine = TorchEngine(resolve_model(settings), EngineConfig.from_settings(settings), start=False)
    try:
        result = run_batching_bench(engine, tuple(concurrency or LEVELS), past_tokens, repeats, json_path)
    finally:
        asyncio.run(engine.close())
    typer.echo(format_batching(result))


@bench_app.command("logprobs")
def bench_logprobs(
    model: Annotated[str | None, typer.Option(help="model dir (default: the tiny VL model)")] = None,
    shape: Annotated[str | None, typer.Option(help="0.6b: a random Qwen3 of 0.6B shape in memory")] = None,
    dtype: Annotated[str, typer.Option(help="fp32 | bf16")] = "fp32",
    rows: Annotated[int, typer.Option(min=1, help="candidate tokens (357: one selection of six)")] = 357,
    repeats: Annotated[int, typer.Option(min=1)] = 5,
    json_path: Annotated[str | None, typer.Option("--json", help="write the figures as JSON")] = None,
) -> None:
    """A selection's log-probabilities through the output head: whole logits vs the engine's blockwise."""
    from ssr_server.bench.logprobs import format_logprobs, run_logprobs_bench
    from ssr_server.bench.scoring import _load

    result = run_logprobs_bench(_load(model, shape, dtype), rows, repeats, json_path)
    typer.echo(format_logprobs(result))


@bench_app.command("overload")
def bench_overload(
    running: Annotated[int, typer.Option(help="SSR_MAX_CONCURRENT_RUNS of the server")] = 16,
    queued: Annotated[int, typer.Option(help="SSR_MAX_QUEUED_RUNS of the server")] = 64,
    factor: Annotated[int, typer.Option(help="send factor x (running + queued) requests at once")] = 4,
    images: Annotated[int, typer.Option(help="16 MP PNGs per request")] = 4,
    keep_pixels: Annotated[int | None, typer.Option(
        help="SSR_IMAGE_KEEP_PIXELS (default: the server's; 0: keep full size)")] = None,
    decode_concurrency: Annotated[int, typer.Option(help="SSR_IMAGE_DECODE_CONCURRENCY")] = 2,
    prefix_cache_mb: Annotated[int | None, typer.Option(
        help="SSR_PREFIX_CACHE_MB (default: the server's); the KV cache grows with runs served")] = None,
    model: Annotated[str | None, typer.Option(help="model dir (default: the offline tiny model)")] = None,
    timeout: Annotated[float, typer.Option(help="seconds for all the answers")] = 600.0,
    json_path: Annotated[str | None, typer.Option("--json", help="write the figures as JSON")] = None,
) -> None:
    """Peak RSS of a real `ssr-server serve` sent 4x its capacity at once, with 16 MP images."""
    from ssr_server.bench import overload

    result = overload.run_overload_bench(running=running, queued=queued, factor=factor, images=images,
                                         keep_pixels=keep_pixels, decode_concurrency=decode_concurrency,
                                         prefix_cache_mb=prefix_cache_mb, model=model, timeout_s=timeout,
                                         json_path=json_path)
    typer.echo(overload.format_table(result))
    if not result.passed:
        raise typer.Exit(1)


@app.command()
def loadtest(
    target: Annotated[str, typer.Option(help="server base URL (loopback unless --allow-remote)")] = (
        "http://127.0.0.1:8000"),
    rate: Annotated[float | None, typer.Option(help="open loop: Poisson arrivals per second")] = None,
    concurrency: Annotated[int | None, typer.Option(help="closed loop: clients")] = None,
    requests: Annotated[int, typer.Option(help="stop launching after this many")] = 100,
    duration: Annotated[float, typer.Option(help="stop launching after this many seconds")] = 60.0,
    mix: Annotated[str, typer.Option(help="mode mix, e.g. ssr=0.5,freeform=0.5")] = "ssr=0.5,freeform=0.5",
    images: Annotated[float, typer.Option(help="fraction of requests with a picture")] = 1.0,
    max_turns: Annotated[int, typer.Option()] = 4,
    tau: Annotated[float, typer.Option()] = 1.0,
    seed: Annotated[int, typer.Option()] = 0,
    slo: Annotated[float, typer.Option(help="seconds, for goodput")] = 10.0,
    timeout: Annotated[float, typer.Option(help="per request, seconds")] = 120.0,
    stream: Annotated[bool, typer.Option(help="use the SSE variant")] = False,
    api_key: Annotated[str | None, typer.Option(envvar="SSR_API_KEY")] = None,
    allow_remote: Annotated[bool, typer.Option(help="allow a non-loopback target")] = False,
    out: Annotated[str, typer.Option(help="report folder (JSON + PNG)")] = "loadtest-out",
) -> None:
    """A bounded load test of POST /v1/agent/runs with a JSON + PNG report."""
    from ssr_server.loadtest import format_table, run_loadtest

    try:
        summary, _ = run_loadtest(
            target, rate=rate, concurrency=concurrency, requests=requests, duration_s=duration, modes=mix,
            with_images=images, max_turns=max_turns, timeout_s=timeout, slo_s=slo, seed=seed,
            api_key=api_key, tau=tau, stream=stream, allow_remote=allow_remote, out_dir=out)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    typer.echo(format_table(summary))


world_app = typer.Typer(no_args_is_help=True, help="The procedural benchmark world.")
app.add_typer(world_app, name="world")


@world_app.command("build")
def world_build(
    out_dir: Annotated[Path, typer.Argument(help="folder to write the world into")],
    entities: Annotated[int, typer.Option(help="invented entities (plus the fixed knowledge ones)")] = 5000,
    seed: Annotated[int, typer.Option()] = 0,
    processes: Annotated[int, typer.Option(help="drawing processes")] = 2,
    image_rank: Annotated[int, typer.Option(help="image search must list the entity within this rank")] = 1,
) -> None:
    """Entities, corpus, image index, question images and questions with gold moves; same seed, same bytes."""
    from ssr_server.errors import InvalidRequest
    from ssr_server.world import build_world

    try:
        report = build_world(out_dir, entities, seed, processes=processes, progress=True,
                             image_rank=image_rank)
    except InvalidRequest as exc:
        raise typer.BadParameter(exc.message) from None
    typer.echo(report.summary())


def _local_agent(settings: Any, world: Path | None = None) -> Any:
    """The agent on the configured embedded engine, tools from ``world`` (a ``world build`` folder) or
    the settings (the demo world when none is set), libraries and format from the settings."""
    from ssr_server.agent.loop import Agent
    from ssr_server.api.app import build_tools
    from ssr_server.engine.factory import build_engine
    from ssr_server.formats.format import get_format
    from ssr_server.library import LibraryRegistry
    from ssr_server.tools.registry import build_registry

    engine = build_engine(settings)
    tools = (build_registry(corpus_path=world / "corpus.jsonl", image_index_dir=world / "images")
             if world is not None else build_tools(settings))
    return Agent(engine, tools, LibraryRegistry(settings.library_dirs),
                 get_format(settings.prompt_format, settings.format_dirs))


@app.command()
def infer(
    input_jsonl: Annotated[Path, typer.Option(help="one example a line: {id?, image, question}")],
    output: Annotated[Path, typer.Option(help="a new or empty folder for the trajectories")],
    num_samples: Annotated[int, typer.Option(min=1, help="runs per example")] = 1,
    seed: Annotated[int, typer.Option(help="selection seed of the first sample")] = 42,
    profiling: Annotated[bool, typer.Option(help="print the latency summary")] = False,
    model: Annotated[str | None, typer.Option(help=MODEL_HELP)] = None,
    server: Annotated[str | None, typer.Option(help="run against a running server (URL) instead")] = None,
    world: Annotated[Path | None, typer.Option(help="tools over a `world build` folder (in process)")] = None,
    mode: Annotated[str, typer.Option(help="ssr | freeform")] = "ssr",
    library: Annotated[str, typer.Option()] = "default",
    tau: Annotated[float, typer.Option()] = 0.0,
    alpha: Annotated[float, typer.Option()] = 1.0,
    max_turns: Annotated[int, typer.Option()] = 8,
    action_temperature: Annotated[float, typer.Option(help="0: greedy actions")] = 0.0,
    concurrency: Annotated[int, typer.Option(min=1)] = 1,
    api_key: Annotated[str | None, typer.Option(envvar="SSR_API_KEY")] = None,
) -> None:
    """Batch inference like the SSR reference harness: trajectories and a profiling summary."""
    from ssr_server.agent.loop import RunOptions
    from ssr_server.batch import infer as batch
    from ssr_server.batch.runner import LocalRunner, RemoteRunner
    from ssr_server.errors import InvalidRequest

    options = RunOptions(mode=mode, library=library, tau=tau, alpha=alpha, max_turns=max_turns,
                         action_temperature=action_temperature)
    try:
        options.validate()
        examples = batch.read_examples(input_jsonl)
    except InvalidRequest as exc:
        raise typer.BadParameter(exc.message) from None
    settings_out = {"input_jsonl": str(input_jsonl), "num_samples": num_samples, "seed": seed, "mode": mode,
                    "library": library, "tau": tau, "alpha": alpha, "max_turns": max_turns,
                    "action_temperature": action_temperature, "server": server}

    async def main() -> dict[str, Any]:
        if server is not None:
            batch.prepare_output(output, settings_out, None)
            remote = RemoteRunner(server, api_key)
            try:
                return await batch.infer(examples, remote, output, options, num_samples=num_samples,
                                         seed=seed, concurrency=concurrency)
            finally:
                await remote.aclose()
        agent = await asyncio.to_thread(_local_agent, _settings(model=model), world)
        try:
            lib = agent.library_for(options)
            ids = agent.candidate_ids(lib, options.label_only)
            extra = {"model": agent.engine.model_name, "format": agent.format.name, "candidates": [
                {"id": c.id, "text": c.text, "action": c.action, "token_ids": list(t)}
                for c, t in zip(lib.candidates, ids, strict=True)]}
            batch.prepare_output(output, {**settings_out, **extra}, agent.format.system_prompt(lib))
            return await batch.infer(examples, LocalRunner(agent), output, options, num_samples=num_samples,
                                     seed=seed, concurrency=concurrency)
        finally:
            await agent.tools.aclose()
            await agent.engine.close()

    try:
        profile = asyncio.run(main())
    except InvalidRequest as exc:
        raise typer.BadParameter(exc.message) from None
    typer.echo(f"trajectories written to {output}")
    if profiling:
        typer.echo(batch.format_summary(profile["summary"]))


@world_app.command("trajectories")
def world_trajectories(
    world: Annotated[Path, typer.Argument(help="a `world build` folder")],
    out: Annotated[Path, typer.Option(help="JSONL file of trajectories (text, in the default format)")],
    mode: Annotated[str, typer.Option(help="ssr | freeform")] = "ssr",
    split: Annotated[str, typer.Option(help="train | dev | test")] = "train",
    limit: Annotated[int | None, typer.Option(help="at most N questions, round-robin on kinds")] = None,
    model: Annotated[str | None, typer.Option(help="whose tokenizer (default: the offline model)")] = None,
) -> None:
    """Oracle trajectories: each question's gold moves played through the real loop and tools."""
    from ssr_server.eval.trajectories import write_trajectories

    n, problems = asyncio.run(write_trajectories(world, out, mode=mode, split=split, limit=limit,
                                                 settings=_settings(model=model)))
    typer.echo(f"{n} trajectories written to {out}; oracle replay success {n - problems}/{n}")
    if problems:
        raise typer.Exit(1)


@app.command("eval")
def eval_command(
    world: Annotated[Path, typer.Option(help="a `world build` folder (questions, corpus, image index)")],
    json_path: Annotated[Path, typer.Option("--json", help="every per-question record and the summary")],
    model: Annotated[str | None, typer.Option(help="model dir (default: the offline tiny model)")] = None,
    server: Annotated[str | None, typer.Option(help="a running server serving the same world")] = None,
    mode: Annotated[str, typer.Option(help="ssr | freeform")] = "ssr",
    split: Annotated[str, typer.Option(help="train | dev | test")] = "test",
    library: Annotated[str, typer.Option()] = "default",
    label_only: Annotated[bool, typer.Option(help="score only the candidates' labels (ablation)")] = False,
    limit: Annotated[int | None, typer.Option(help="at most N questions, round-robin on kinds")] = None,
    concurrency: Annotated[int, typer.Option(min=1)] = 1,
    max_turns: Annotated[int, typer.Option()] = 6,
    reasoning_budget: Annotated[int, typer.Option(help="freeform: reasoning tokens per turn")] = 128,
    seed: Annotated[int, typer.Option()] = 0,
    api_key: Annotated[str | None, typer.Option(envvar="SSR_API_KEY")] = None,
) -> None:
    """Task success, move accuracy and latency on a benchmark split, per question kind."""
    from ssr_server.agent.loop import RunOptions
    from ssr_server.batch.runner import LocalRunner, RemoteRunner, Runner
    from ssr_server.eval.report import format_summary
    from ssr_server.eval.runner import run_eval, select_questions, write_eval
    from ssr_server.library import LibraryRegistry

    questions = select_questions(world, split, limit)
    if not questions:
        raise typer.BadParameter(f"no {split} questions in {world}")
    options = RunOptions(mode=mode, library=library, label_only=label_only, max_turns=max_turns,
                         reasoning_budget=reasoning_budget)
    settings = _settings(model=model)
    lib = LibraryRegistry(settings.library_dirs).get(library)
    actions: dict[str, str] = {c.id: c.action for c in lib.candidates}
    meta: dict[str, Any] = {
        "world": str(world), "split": split, "mode": mode, "library": library, "label_only": label_only,
        "questions": len(questions), "max_turns": max_turns, "server": server, "model": model, "seed": seed}

    async def main() -> list[dict[str, Any]]:
        runner: Runner
        if server is not None:
            remote = RemoteRunner(server, api_key)
            try:
                return await run_eval(questions, remote, world, options, actions, concurrency=concurrency,
                                      seed=seed)
            finally:
                await remote.aclose()
        agent = await asyncio.to_thread(_local_agent, settings, world)
        runner = LocalRunner(agent)
        try:
            meta["model"] = agent.engine.model_name
            return await run_eval(questions, runner, world, options, actions, concurrency=concurrency,
                                  seed=seed)
        finally:
            await agent.tools.aclose()
            await agent.engine.close()

    records = asyncio.run(main())
    summary = write_eval(json_path, meta, records)
    typer.echo(format_summary(summary, f"eval {mode} on {split} ({len(records)} questions) - {json_path}"))


train_app = typer.Typer(no_args_is_help=True, help="Train a selector: SFT and SSR-GRPO on a world.")
app.add_typer(train_app, name="train")


def _kind_repeats(items: list[str]) -> tuple[tuple[str, int], ...]:
    from ssr_server.world.records import KINDS

    out: list[tuple[str, int]] = []
    for item in items:
        kind, _, n = item.partition("=")
        if kind not in KINDS or not n.isdigit() or int(n) < 1:
            raise typer.BadParameter(f"--repeat takes KIND=N, KIND one of {', '.join(KINDS)} and N >= 1, "
                                     f"got {item!r}")
        out.append((kind, int(n)))
    return tuple(out)


def _int_pair(text: str, option: str) -> tuple[int, int]:
    try:
        a, b = (int(x) for x in text.split(","))
    except ValueError:
        raise typer.BadParameter(f"{option} takes two integers such as 2,4") from None
    if a < 0 or b < 0:
        raise typer.BadParameter(f"{option} takes non-negative integers")
    return a, b


def _jitter_help(what: str) -> str:
    return (f"{what} move sideways by a random amount up to this many gold-box widths (0: centred), "
            "as a model's imprecise zoom box makes them")


def _zoom_style(text: str) -> str:
    from ssr_server.world.views import check_zoom_style

    try:
        return check_zoom_style(text)
    except ValueError as exc:
        raise typer.BadParameter(f"--zoom: {exc}") from None


def _report_training(figures: dict[str, Any], out: Path) -> None:
    typer.echo(json.dumps(figures, indent=1, default=str))
    typer.echo(f"model written to {out}")


@train_app.command("sft")
def train_sft_command(
    world: Annotated[Path, typer.Option(help="a `world build` folder")],
    out: Annotated[Path, typer.Option(help="where the model goes (resumes from its checkpoints)")],
    format: Annotated[str, typer.Option(help="ssr | freeform: the trajectories' form")] = "ssr",
    init: Annotated[str, typer.Option(help="a shape HxL (fresh model) or a model folder")] = "256x4",
    library: Annotated[str, typer.Option(help="the rationale library (ssr form)")] = "default",
    label_only: Annotated[bool, typer.Option(help="train on index labels instead of texts")] = False,
    steps: Annotated[int, typer.Option(min=1)] = 1500,
    batch_size: Annotated[int, typer.Option(min=1)] = 16,
    lr: Annotated[float, typer.Option()] = 1e-3,
    seed: Annotated[int, typer.Option()] = 0,
    limit: Annotated[int | None, typer.Option(help="at most this many training questions")] = None,
    paraphrases: Annotated[int, typer.Option(min=1, help="freeform: reasoning paraphrases each")] = 2,
    max_minutes: Annotated[float, typer.Option(help="wall-clock budget; saves and stops")] = 28.0,
    anneal_by_time: Annotated[bool, typer.Option(help="the learning rate also decays with the share of "
                                                      "--max-minutes spent, so that a run the budget "
                                                      "cuts short still ends annealed (not "
                                                      "deterministic)")] = False,
    threads: Annotated[int | None, typer.Option(help="torch threads (default: all cores)")] = None,
    rename: Annotated[bool, typer.Option(help="a fresh name for the entity at each draw (copy, not "
                                                "remember)")] = False,
    drills: Annotated[bool, typer.Option(help="interleave short copying drills (query, answer)")] = False,
    drill_sizes: Annotated[str, typer.Option(help="answer,query drill batches in multiples of "
                                                  "--batch-size")] = "2,4",
    drill_calls: Annotated[str, typer.Option(help="query drills of each trajectory's first text search, "
                                                  "or of all (two-hop: the second hop too)")] = "first",
    drills_repeat: Annotated[bool, typer.Option(help="drills drawn with the --repeat weights too")] = False,
    rephrase: Annotated[float, typer.Option(min=0.0, max=1.0, help="share of drawn fact and two-hop "
                                                                   "questions asked in other words")] = 0.0,
    drill_contrast: Annotated[bool, typer.Option(help="each two-hop second query drill also asked about the "
                                                      "other person attribute (born / birthplace)")] = False,
    copy_every: Annotated[int, typer.Option(min=0, help="every Nth step a batch of the synthetic copying "
                                                        "task (0: never)")] = 0,
    copy_warmup: Annotated[int, typer.Option(min=0, help="steps of the copying task alone first")] = 0,
    repeat: Annotated[list[str] | None, typer.Option(help="KIND=N: that question kind's trajectories N times "
                                                          "per epoch (repeatable)")] = None,
    pictures_every: Annotated[int, typer.Option(min=0, help="every Nth step a batch of picture drills: "
                                                            "visual/detail trajectories with a freshly "
                                                            "drawn picture (0: never; 1: every step, "
                                                            "a reading phase)")] = 0,
    pictures_batch: Annotated[int, typer.Option(min=1, help="drills per picture batch")] = 32,
    picture_moves: Annotated[bool, typer.Option(help="picture drills also of first moves (search, two-hop, "
                                                     "knowledge), not only of reading")] = True,
    freeze_vision: Annotated[bool, typer.Option(help="keep the vision tower as loaded (e.g. what `train "
                                                     "vision` taught it); train the language model "
                                                     "only")] = False,
    zoom: Annotated[str, typer.Option(help="the zoom box of detail trajectories and drills: tight (the gold "
                                           "box), strip (its rows, the whole width), wide (3x its "
                                           "width) or coarse (two calls: the strip, then the wide "
                                           "columns in the strip's crop)")] = "tight",
    zoom_jitter: Annotated[float, typer.Option(min=0.0, max=3.0,
                                               help=_jitter_help("picture drills' crops"))] = 0.0,
    zoom_sign: Annotated[bool, typer.Option(help="questions about the big sign zoom on it before they answer "
                                                 "(the tiny tower cannot read it at the question image's "
                                                 "35 tokens); the world is not changed")] = False,
    zoom_count: Annotated[bool, typer.Option(help="count questions zoom on the motif before they answer")]
        = False,
) -> None:
    """Supervised training on the world's oracle trajectories (loss on assistant tokens only)."""
    from ssr_server.train.sft import SFTConfig, train_sft

    if format not in ("ssr", "freeform"):
        raise typer.BadParameter("format must be ssr or freeform")
    if copy_every == 1:
        raise typer.BadParameter("--copy-every takes 0 (never) or N >= 2 (every Nth step)")
    if drill_calls not in ("first", "all"):
        raise typer.BadParameter("--drill-calls takes first or all")
    figures = train_sft(SFTConfig(world=world, out=out, format=format, init=init, library=library,
                                  label_only=label_only, steps=steps, batch_size=batch_size, lr=lr, seed=seed,
                                  limit=limit, paraphrases=paraphrases, max_minutes=max_minutes,
                                  anneal_by_time=anneal_by_time, threads=threads, rename=rename,
                                  drills=drills,
                                  drill_sizes=_int_pair(drill_sizes, "--drill-sizes"),
                                  drill_calls=drill_calls, drills_repeat=drills_repeat,
                                  drill_contrast=drill_contrast, rephrase=rephrase, copy_every=copy_every,
                                  copy_warmup=copy_warmup, repeat=_kind_repeats(repeat or []),
                                  pictures_every=pictures_every, pictures_batch=pictures_batch,
                                  picture_moves=picture_moves, freeze_vision=freeze_vision,
                                  zoom=_zoom_style(zoom), zoom_jitter=zoom_jitter, zoom_sign=zoom_sign,
                                  zoom_count=zoom_count))
    _report_training(figures, out)


@train_app.command("vision")
def train_vision_command(
    init: Annotated[Path, typer.Option(help="the model folder whose vision tower is trained")],
    out: Annotated[Path, typer.Option(help="where the model goes")],
    steps: Annotated[int, typer.Option(min=1)] = 1000,
    batch_size: Annotated[int, typer.Option(min=1, help="pictures per step")] = 32,
    lr: Annotated[float, typer.Option()] = 1e-3,
    reinit: Annotated[bool, typer.Option(help="start the tower from fresh weights")] = False,
    seed: Annotated[int, typer.Option()] = 0,
    max_minutes: Annotated[float, typer.Option(help="wall-clock budget; saves and stops")] = 28.0,
    threads: Annotated[int | None, typer.Option(help="torch threads (default: all cores)")] = None,
    heads: Annotated[str, typer.Option(help="comma-separated heads: colour, count, sign, plaque, count_mean "
                                            "(count from the tokens' mean), known (well-known entities), "
                                            "plaque_x, plaque_y (where the plaque is, in tenths), "
                                            "sign_crop, count_crop (the big sign, the count read from "
                                            "a zoom crop around the sign, the motif)")]
        = "colour,count,sign,plaque",
    known_share: Annotated[float, typer.Option(min=0.0, max=1.0, help="with the known head: share of "
                                                                      "pictures of well-known entities")]
        = 0.25,
    anchor: Annotated[float, typer.Option(min=0.0, help="weight of the tokens' drift from the initial "
                                                        "tower's (0: free)")] = 0.0,
    anchor_crops: Annotated[float | None, typer.Option(
        min=0.0, help="the same for the zoom crops' tokens (default: as --anchor; 0 frees a crop style the "
                      "language model has not read yet while the question pictures stay anchored)")] = None,
    image_pixels: Annotated[int | None, typer.Option(
        min=4096, help="resize every picture to about this many pixels, and the model keeps it (default: as "
                       "--init does); 143360 = 448x320, four times the tokens of the world's pictures")
    ] = None,
    max_pixels: Annotated[int | None, typer.Option(
        min=4096, help="only the most pixels a picture keeps, and the model keeps it: the question images "
                       "(35,840 px) stay as they are, a wider zoom crop (a strip: 1024x123) gets more tokens")
    ] = None,
    zoom: Annotated[str, typer.Option(help="the plaque head reads the crop at the zoom box of this style: "
                                           "tight (the gold box), strip (its rows, the whole width), "
                                           "wide (3x its width; coarse reads the same crop)")]
        = "tight",
    zoom_jitter: Annotated[float, typer.Option(min=0.0, max=3.0, help=_jitter_help("the crops"))] = 0.0,
) -> None:
    """Train the vision tower on freshly drawn pictures (heads on what questions read, not kept)."""
    from ssr_server.train.vision import EXTRA, LABELS, VisionConfig, train_vision

    if not (init / "config.json").is_file():
        raise typer.BadParameter(f"{init} is not a model folder (no config.json)")
    chosen = tuple(h.strip() for h in heads.split(",") if h.strip())
    if not chosen or set(chosen) - set(LABELS) - set(EXTRA):
        raise typer.BadParameter(f"--heads takes some of {', '.join([*LABELS, *EXTRA])}")
    figures = train_vision(VisionConfig(init=init, out=out, steps=steps, batch_size=batch_size, lr=lr,
                                        reinit=reinit, seed=seed, max_minutes=max_minutes, threads=threads,
                                        heads=chosen, known_share=known_share, anchor=anchor,
                                        anchor_crops=anchor_crops,
                                        image_pixels=image_pixels, max_pixels=max_pixels,
                                        zoom=_zoom_style(zoom), zoom_jitter=zoom_jitter))
    _report_training(figures, out)


@train_app.command("probe")
def train_probe_command(
    world: Annotated[Path, typer.Option(help="a `world build` folder")],
    model: Annotated[str | None, typer.Option(help="model dir (default: the shipped model)")] = None,
    split: Annotated[str, typer.Option(help="train | dev | test: whose visual/detail trajectories")] = "test",
    drills: Annotated[int, typer.Option(min=2, help="reading drills drawn")] = 128,
    seed: Annotated[int, typer.Option()] = 12345,
    threads: Annotated[int | None, typer.Option(help="torch threads (default: all cores)")] = None,
    json_path: Annotated[str | None, typer.Option("--json", help="write the figures as JSON")] = None,
    zoom: Annotated[str, typer.Option(help="the zoom style detail drills use: tight, strip or wide (as the "
                                           "model was trained: `train sft --zoom`)")] = "tight",
) -> None:
    """Does the model read its pictures? Teacher-forced answers on fresh pictures vs another drill's."""
    from ssr_server.engine.factory import resolve_model
    from ssr_server.train.reading_probe import ProbeConfig, format_probe, run_probe

    if split not in ("train", "dev", "test"):
        raise typer.BadParameter("split must be train, dev or test")
    if not (world / "questions.jsonl").is_file():
        raise typer.BadParameter(f"{world} is not a built world (no questions.jsonl)")
    try:
        result = run_probe(ProbeConfig(world=world, model=resolve_model(_settings(model=model)), split=split,
                                       drills=drills, seed=seed, threads=threads, zoom=_zoom_style(zoom)))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=1), encoding="utf-8")
    typer.echo(format_probe(result))


@train_app.command("pretrain")
def train_pretrain_command(
    world: Annotated[Path, typer.Option(help="a `world build` folder")],
    out: Annotated[Path, typer.Option(help="where the model goes")],
    init: Annotated[str, typer.Option(help="the shape HxL[-tied] of the fresh model")] = "128x4-tied",
    steps: Annotated[int, typer.Option(min=1)] = 1000,
    batch_size: Annotated[int, typer.Option(min=1)] = 16,
    seq_len: Annotated[int, typer.Option(min=8, help="tokens per row")] = 384,
    lr: Annotated[float, typer.Option()] = 3e-3,
    seed: Annotated[int, typer.Option()] = 0,
    max_minutes: Annotated[float, typer.Option(help="wall-clock budget; saves and stops")] = 10.0,
    threads: Annotated[int | None, typer.Option(help="torch threads (default: all cores)")] = None,
    rename: Annotated[bool, typer.Option(help="a fresh invented name per entity group")] = True,
    questions: Annotated[bool, typer.Option(help="named questions + answers after each group")] = True,
) -> None:
    """Next-token pretraining of a fresh model on the training entities' corpus (the base for SFT)."""
    from ssr_server.train.pretrain import PretrainConfig, train_pretrain

    figures = train_pretrain(PretrainConfig(
        world=world, out=out, init=init, steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr,
        seed=seed, max_minutes=max_minutes, threads=threads, rename=rename, questions=questions))
    _report_training(figures, out)


@train_app.command("grpo")
def train_grpo_command(
    world: Annotated[Path, typer.Option(help="a `world build` folder")],
    init: Annotated[Path, typer.Option(help="the SFT model to start from")],
    out: Annotated[Path, typer.Option(help="where the model goes (resumes from its checkpoints)")],
    format: Annotated[str, typer.Option(help="ssr | freeform")] = "ssr",
    iterations: Annotated[int, typer.Option(min=1)] = 20,
    questions: Annotated[int, typer.Option(min=1, help="questions per iteration")] = 8,
    group: Annotated[int, typer.Option(min=2, help="rollouts per question (G)")] = 8,
    epochs: Annotated[int, typer.Option(min=1, help="update epochs per rollout batch")] = 2,
    lr: Annotated[float, typer.Option()] = 1e-4,
    clip: Annotated[float, typer.Option(help="PPO clip epsilon")] = 0.2,
    gamma: Annotated[float, typer.Option(help="weight of a selection decision vs an action token")] = 1.0,
    selector_grad: Annotated[str, typer.Option(help="exact (all K scores) | detached (paper)")] = "exact",
    ratio_level: Annotated[str, typer.Option(help="token (GRPO) | sequence (GSPO) for actions")] = "token",
    kl: Annotated[float, typer.Option(help="KL to the initial model on action tokens")] = 0.0,
    tau: Annotated[float, typer.Option(min=0.0, help="selection temperature of the rollouts (and of q "
                                                     "in the ratio)")] = 1.0,
    temperature: Annotated[float, typer.Option(min=0.0, help="action sampling temperature of the "
                                                             "rollouts")] = 1.0,
    seed: Annotated[int, typer.Option()] = 0,
    max_minutes: Annotated[float, typer.Option(help="wall-clock budget; saves and stops")] = 28.0,
    threads: Annotated[int | None, typer.Option(help="torch threads (default: all cores)")] = None,
    kind: Annotated[list[str] | None, typer.Option(help="draw only questions of this kind (repeatable; "
                                                        "default: every kind)")] = None,
    freeze_vision: Annotated[bool, typer.Option(help="keep the vision tower as loaded")] = False,
    anchor: Annotated[float, typer.Option(min=0.0, help="weight of an SFT anchor: the oracle "
                                                        "trajectories' cross-entropy (every kind) added "
                                                        "at each step")] = 0.0,
    anchor_batch: Annotated[int, typer.Option(min=1, help="anchor trajectories per step")] = 16,
    anchor_zoom: Annotated[str, typer.Option(help="zoom style of the anchor's trajectories (the one the "
                                                  "model was trained on)")] = "tight",
    anchor_rename: Annotated[bool, typer.Option(help="rename the anchor's entities (as `train sft "
                                                     "--rename`)")] = False,
    anchor_rephrase: Annotated[float, typer.Option(min=0.0, max=1.0, help="share of the anchor's "
                                                   "questions rephrased (as `train sft --rephrase`)")] = 0.0,
) -> None:
    """GRPO through the real agent loop; SSR turns contribute one categorical ratio each."""
    from ssr_server.train.grpo import GRPOConfig, train_grpo
    from ssr_server.world.records import KINDS
    from ssr_server.world.views import ZOOM_STYLES

    unknown = sorted(set(kind or []) - set(KINDS))
    if unknown:
        raise typer.BadParameter(f"--kind: {', '.join(unknown)} (kinds: {', '.join(KINDS)})")
    if anchor_zoom not in ZOOM_STYLES:
        raise typer.BadParameter(f"--anchor-zoom: one of {', '.join(ZOOM_STYLES)}")

    if format not in ("ssr", "freeform") or selector_grad not in ("exact", "detached") \
            or ratio_level not in ("token", "sequence"):
        raise typer.BadParameter("format: ssr|freeform; selector-grad: exact|detached; "
                                 "ratio-level: token|sequence")
    if format == "ssr" and tau <= 0:
        raise typer.BadParameter("--tau must be > 0: the ssr ratio is over q = softmax(S / tau)")
    figures = train_grpo(GRPOConfig(
        world=world, init=init, out=out, format=format, iterations=iterations, questions=questions,
        group=group,
        epochs=epochs, lr=lr, clip=clip, gamma=gamma, selector_grad=selector_grad,  # type: ignore[arg-type]
        ratio_level=ratio_level, kl=kl, seed=seed, max_minutes=max_minutes,  # type: ignore[arg-type]
        threads=threads, tau=tau, temperature=temperature, kinds=tuple(kind or ()),
        freeze_vision=freeze_vision, anchor=anchor, anchor_batch=anchor_batch, anchor_zoom=anchor_zoom,
        anchor_rename=anchor_rename, anchor_rephrase=anchor_rephrase))
    _report_training(figures, out)


def main() -> None:
    app(prog_name="ssr-server")


if __name__ == "__main__":
    main()

"""``ssr-server bench``: benchmarks that print figures measured side by side."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer

from ssr_server.cli.common import MODEL_HELP, make_settings

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks that print figures measured side by side.")


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

        url = sglang_url or make_settings().sglang_url
        res = sglang_scoring.run_sglang_scoring_bench(url, model or resolve_model(make_settings()), repeats,
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
    model: Annotated[str | None, typer.Option(help=MODEL_HELP)] = None,
    concurrency: Annotated[list[int] | None, typer.Option(help="levels (repeatable)")] = None,
    runs: Annotated[int, typer.Option(help="runs per level")] = 32,
    max_turns: Annotated[int, typer.Option()] = 4,
    repeats: Annotated[int, typer.Option(help="repeat each level; the median is reported")] = 1,
    json_path: Annotated[str | None, typer.Option("--json", help="write the figures as JSON")] = None,
    mixed: Annotated[bool, typer.Option(help="also the mixed-load case (decoding during a prefill)")] = True,
    mixed_only: Annotated[bool, typer.Option(help="only the mixed-load case")] = False,
    warm_start: Annotated[bool, typer.Option(help="each level starts with the system prompt cached")] = False,
    tracing: Annotated[bool, typer.Option(
        help="instead: the same load with tracing off and on (OTLP, every request), side by side, at "
        "the first --concurrency (default 4)")] = False,
) -> None:
    """Runs/s and per-turn reasoning p95 at several concurrencies, one real server, side by side;
    inter-token latency of a decoding run while another run prefills a ~4,000-token context."""
    if tracing:
        from ssr_server.bench.tracing import format_tracing, run_tracing_bench

        res = run_tracing_bench(model=model, concurrency=(concurrency or [4])[0], runs=runs,
                                repeats=max(repeats, 3), max_turns=max_turns, json_path=json_path)
        typer.echo(format_tracing(res))
        return
    from ssr_server.bench import serve as serve_bench

    result = serve_bench.run_serve_bench(model=model, concurrencies=tuple(concurrency or (1, 4, 8)),
                                         runs_per_level=runs, max_turns=max_turns, json_path=json_path,
                                         repeats=repeats, mixed=mixed, mixed_only=mixed_only,
                                         warm_start=warm_start)
    typer.echo(serve_bench.format_table(result))


@bench_app.command("runstore")
def bench_runstore(
    model: Annotated[str | None, typer.Option(help=MODEL_HELP)] = None,
    runs: Annotated[int, typer.Option(min=0, help="finished runs in the store (0: skip the reads)")] = 10_000,
    samples: Annotated[int, typer.Option(min=1, help="timed requests per read")] = 200,
    concurrency: Annotated[int, typer.Option(min=1, help="clients of the store on/off load")] = 8,
    load_runs: Annotated[int, typer.Option(min=0, help="runs per store on/off level (0: skip)")] = 48,
    repeats: Annotated[int, typer.Option(min=1, help="store off/on levels, interleaved")] = 2,
    json_path: Annotated[str | None, typer.Option("--json", help="write the figures as JSON")] = None,
) -> None:
    """Run store: list and fetch p95 with many stored runs (SQLite); run latency with the store on vs off."""
    from ssr_server.bench.runstore import format_runstore, run_runstore_bench

    result = run_runstore_bench(runs, samples, model=model, concurrency=concurrency, load_runs=load_runs,
                                repeats=repeats, json_path=json_path)
    typer.echo(format_runstore(result))


@bench_app.command("batching")
def bench_batching(
    model: Annotated[str | None, typer.Option(help=MODEL_HELP)] = None,
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

    settings = make_settings(model=model)
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


@bench_app.command("decode")
def bench_decode(
    model: Annotated[str | None, typer.Option(help=MODEL_HELP)] = None,
    dtype: Annotated[str, typer.Option(help="fp32 | bf16")] = "bf16",
    threads: Annotated[int, typer.Option(min=1, help="torch intra-op threads")] = 1,
    new_tokens: Annotated[int, typer.Option(min=2, help="tokens per generation")] = 48,
    repeats: Annotated[int, typer.Option(min=1, help="alternating rounds (median)")] = 5,
    json_path: Annotated[str | None, typer.Option("--json", help="write the figures as JSON")] = None,
) -> None:
    """Embedded engine's ms per decoded token beside the memory-bandwidth limit of the model's weights."""
    from ssr_server.bench.decode import format_decode, run_decode_bench
    from ssr_server.engine.factory import resolve_model

    result = run_decode_bench(model or resolve_model(make_settings()), dtype, threads, new_tokens, repeats,
                              json_path)
    typer.echo(format_decode(result))


@bench_app.command("router")
def bench_router(
    model: Annotated[str | None, typer.Option(help=MODEL_HELP)] = None,
    runs: Annotated[int, typer.Option(min=1, help="runs per policy and level (demo world questions)")] = 16,
    concurrency: Annotated[list[int] | None, typer.Option(
        help="concurrent runs (repeatable; default 1 and 8)")] = None,
    policy: Annotated[list[str] | None, typer.Option(
        help="router policy (repeatable; default cache_aware, round_robin, manual)")] = None,
    eval_questions: Annotated[int, typer.Option(min=0, help="ssr-lab eval through the router vs embedded "
                                                           "(0: skip)")] = 120,
    world: Annotated[Path | None, typer.Option(help="world for the eval (default: one built for it)")] = None,
    worker_loss: Annotated[bool, typer.Option(help="SIGKILL a worker under 8 runs, then the other")] = True,
    json_path: Annotated[str | None, typer.Option("--json", help="write the figures as JSON")] = None,
) -> None:
    """Two real SGLang CPU workers behind SGLang's router (a checkout's scripts/sglang-router.sh): cached
    tokens and latency per policy, eval through the router vs embedded, a worker lost under load."""
    from ssr_server.bench import router

    result = router.run_router_bench(model=model, runs=runs, concurrencies=tuple(concurrency or (1, 8)),
                                     policies=tuple(policy or router.POLICIES),
                                     eval_questions=eval_questions, world=world, worker_loss=worker_loss,
                                     json_path=json_path)
    typer.echo(router.format_table(result))


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
    model: Annotated[str | None, typer.Option(help=MODEL_HELP)] = None,
    timeout: Annotated[float, typer.Option(help="seconds for all the answers")] = 600.0,
    json_path: Annotated[str | None, typer.Option("--json", help="write the figures as JSON")] = None,
    admission: Annotated[bool, typer.Option(
        help="instead: admission before the body; one slot, no queue, bursts of such requests against a "
             "full and an idle server, by both kinds of client")] = False,
    burst: Annotated[list[int] | None, typer.Option(
        help="with --admission: requests per burst (repeatable; default 40 and 400)")] = None,
    client: Annotated[list[str] | None, typer.Option(
        help="with --admission: plain (no Expect: the whole body, then read) | expect (Expect: 100-continue)"
    )] = None,
    reasoning_budget: Annotated[int, typer.Option(
        help="with --admission: reasoning tokens a turn, so that the admitted run holds its slot")] = 1024,
) -> None:
    """Peak RSS of a real `ssr-server serve` sent 4x its capacity at once, with 16 MP images; with
    --admission, how fast and at what memory cost a one-slot server refuses bursts before their bodies."""
    from ssr_server.bench import overload

    if admission:
        from ssr_server.bench import admission as admission_bench

        kinds = tuple(client or admission_bench.CLIENTS)
        if any(k not in admission_bench.CLIENTS for k in kinds):
            raise typer.BadParameter(f"--client takes {' or '.join(admission_bench.CLIENTS)}")
        adm = admission_bench.run_admission_bench(
            bursts=tuple(burst or (40, 400)), clients=kinds, images=images, reasoning_budget=reasoning_budget,
            max_turns=2, model=model, timeout_s=min(timeout, 300.0), json_path=json_path)
        typer.echo(admission_bench.format_admission(adm))
        if not adm.passed:
            raise typer.Exit(1)
        return
    result = overload.run_overload_bench(running=running, queued=queued, factor=factor, images=images,
                                         keep_pixels=keep_pixels, decode_concurrency=decode_concurrency,
                                         prefix_cache_mb=prefix_cache_mb, model=model, timeout_s=timeout,
                                         json_path=json_path)
    typer.echo(overload.format_table(result))
    if not result.passed:
        raise typer.Exit(1)


@bench_app.command("actions")
def bench_actions(
    world: Annotated[Path | None, typer.Option(
        help="a world folder (questions.jsonl, corpus.jsonl, images/; `ssr-lab world build` writes one); "
        "default: the shipped demo world")] = None,
    split: Annotated[str, typer.Option(help="train | dev | test")] = "test",
    limit: Annotated[int | None, typer.Option(help="first N questions of the split")] = None,
    concurrency: Annotated[int, typer.Option(min=1)] = 4,
    mode: Annotated[list[str] | None, typer.Option(help="ssr | freeform (repeatable; default both)")] = None,
    model: Annotated[str | None, typer.Option(help=MODEL_HELP)] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="write the figures as JSON")] = None,
    repeats: Annotated[int, typer.Option(min=1, help="run the split this many times (ratios per repeat "
                                                     "printed too)")] = 1,
) -> None:
    """Where action time goes (prefill, decode forwards, grammar, sampling, drafting, detokenising), and
    drafts (jump-forward, prompt lookup) off vs on, side by side on one engine: forwards, ms, same text."""
    from ssr_server.bench import actions
    from ssr_server.cli.common import local_agent
    from ssr_server.tools.demo import shipped_demo_world

    modes = tuple(mode or ("ssr", "freeform"))
    if any(m not in ("ssr", "freeform") for m in modes):
        raise typer.BadParameter("--mode takes ssr or freeform")
    root = world or shipped_demo_world().root
    settings = make_settings(model=model)
    if settings.engine != "torch":
        raise typer.BadParameter("bench actions measures the embedded engine (SSR_ENGINE=torch)")
    agent = local_agent(settings, root)
    try:
        result = actions.run(agent, root, split, limit, concurrency, modes, json_path, repeats)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    finally:
        asyncio.run(_close(agent))
    typer.echo(actions.format_table(result))
    if actions.failed(result):  # the figures leave those runs out: not a comparison to report
        raise typer.Exit(1)


async def _close(agent: Any) -> None:
    await agent.tools.aclose()
    await agent.engine.close()

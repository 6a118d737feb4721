"""``ssr-server bench``: benchmarks that print figures measured side by side."""

from __future__ import annotations

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

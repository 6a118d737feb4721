"""``ssr-server``: serve | ask | bench | tiny-model | sglang-launch | loadtest."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer

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
    model: Annotated[str | None, typer.Option(help="model dir or hub id (default: offline tiny)")] = None,
    host: Annotated[str | None, typer.Option()] = None,
    port: Annotated[int | None, typer.Option()] = None,
    dtype: Annotated[str | None, typer.Option(help="fp32 | bf16 | fp16")] = None,
    sglang_url: Annotated[str | None, typer.Option()] = None,
    log_level: Annotated[str, typer.Option()] = "info",
) -> None:
    """Run the agent server (FastAPI on uvicorn). Settings also come from SSR_* variables."""
    import logging

    import uvicorn

    from ssr_server.api.app import create_app

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = _settings(engine=engine, model=model, host=host, port=port, dtype=dtype, sglang_url=sglang_url)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=log_level,
                timeout_graceful_shutdown=math.ceil(settings.drain_timeout_s))


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
    model: Annotated[str | None, typer.Option(help="model dir or hub id (default: offline tiny)")] = None,
    server: Annotated[str | None, typer.Option(help="ask a running server instead (URL)")] = None,
    mode: Annotated[str, typer.Option(help="ssr | freeform")] = "ssr",
    library: Annotated[str, typer.Option()] = "default",
    tau: Annotated[float, typer.Option()] = 0.0,
    seed: Annotated[int | None, typer.Option()] = None,
    max_turns: Annotated[int, typer.Option()] = 6,
    as_json: Annotated[bool, typer.Option("--json", help="print the whole run as JSON")] = False,
    api_key: Annotated[str | None, typer.Option(envvar="SSR_API_KEY")] = None,
    expect_answer: Annotated[bool, typer.Option(help="exit 2 unless the run ends with an answer")] = False,
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


async def _ask_local(question: str, images: list[bytes], model: str | None, mode: str, library: str,
                     tau: float, seed: int | None, max_turns: int) -> dict[str, Any]:
    from ssr_server.agent.loop import Agent, RunOptions
    from ssr_server.api.app import build_tools
    from ssr_server.api.images import ImageLimits, decode_image_bytes
    from ssr_server.engine.factory import build_engine
    from ssr_server.library import LibraryRegistry

    settings = _settings(model=model)
    engine = build_engine(settings)
    tools = build_tools(settings)
    try:
        refs = [decode_image_bytes(b, ImageLimits()) for b in images]
        agent = Agent(engine, tools, LibraryRegistry(settings.library_dirs))
        run = await agent.run(question, refs, RunOptions(mode=mode, library=library, tau=tau, seed=seed,
                                                         max_turns=max_turns))
        return run.to_dict()
    finally:
        await tools.aclose()
        await engine.close()


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
) -> None:
    """Runs/s and per-turn reasoning p95 at several concurrencies, one real server, side by side."""
    from ssr_server.bench import serve as serve_bench

    result = serve_bench.run_serve_bench(model=model, concurrencies=tuple(concurrency or (1, 4, 8)),
                                         runs_per_level=runs, max_turns=max_turns, json_path=json_path,
                                         repeats=repeats)
    typer.echo(serve_bench.format_table(result))


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


def main() -> None:
    app(prog_name="ssr-server")


if __name__ == "__main__":
    main()

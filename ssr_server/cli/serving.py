"""Serving from the command line: the server, one question, the tiny model, SGLang's launcher, load tests."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from ssr_server.cli.common import MODEL_HELP, local_agent, make_settings
from ssr_server.core.limits import DEFAULT_MAX_TURNS
from ssr_server.core.selection import DEFAULT_TAU


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
    from ssr_server.api.app import create_app, drain_app
    from ssr_server.api.connections import server_config
    from ssr_server.api.shutdown import DrainingServer
    from ssr_server.core import logs

    logs.setup("text", log_level)
    settings = make_settings(engine=engine, model=model, host=host, port=port, dtype=dtype,
                             sglang_url=sglang_url)
    application = create_app(settings)
    # The connection bounds (header, body and keep-alive timeouts, connection cap) and uvicorn's short
    # graceful wait (the drain came first: only idle connections are left) come from server_config.
    config = server_config(application, settings, log_level=log_level)
    logs.setup(settings.log_format, log_level)  # after uvicorn's own logging set-up, which it replaces
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


def ask(
    question: Annotated[str, typer.Option(help="the question")],
    image: Annotated[list[Path] | None, typer.Option(help="image file (repeatable)")] = None,
    model: Annotated[str | None, typer.Option(help=MODEL_HELP)] = None,
    server: Annotated[str | None, typer.Option(help="ask a running server instead (URL)")] = None,
    mode: Annotated[str, typer.Option(help="ssr | freeform")] = "ssr",
    library: Annotated[str, typer.Option()] = "default",
    tau: Annotated[float, typer.Option()] = DEFAULT_TAU,
    seed: Annotated[int | None, typer.Option()] = None,
    max_turns: Annotated[int, typer.Option()] = DEFAULT_MAX_TURNS,
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
        from ssr_server.core.answers import is_correct

        right = run["answer"] is not None and is_correct(run["answer"], gold[0], gold[1:])
        print(f"correct: {'yes' if right else 'no'} (the right answer: {gold[0]})")
        if expect_correct and not right:
            raise typer.Exit(3)


async def _ask_local(question: str, images: list[bytes], model: str | None, mode: str, library: str,
                     tau: float, seed: int | None, max_turns: int) -> dict[str, Any]:
    from ssr_server.agent.loop import RunOptions
    from ssr_server.core.images.intake import decode_image_bytes
    from ssr_server.core.images.limits import ImageLimits

    agent = local_agent(make_settings(model=model))
    try:
        refs = [decode_image_bytes(b, ImageLimits()) for b in images]
        run = await agent.run(question, refs, RunOptions(mode=mode, library=library, tau=tau, seed=seed,
                                                         max_turns=max_turns))
        return dict(run.to_dict())
    finally:
        await agent.tools.aclose()
        await agent.engine.close()


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


def sglang_launch(ctx: typer.Context) -> None:
    """Start SGLang's server with our /ssr/score route (run inside SGLang's environment)."""
    from ssr_server.engine.sglang.server import main as launch

    launch(list(ctx.args))


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

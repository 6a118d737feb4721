"""Batch inference from the command line: ``ssr-server infer``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer

from ssr_server.cli.common import MODEL_HELP, local_agent, make_settings
from ssr_server.core.selection import DEFAULT_ALPHA, DEFAULT_TAU


def infer(
    input_jsonl: Annotated[Path, typer.Option(help="one example a line: {id?, image, question}")],
    output: Annotated[Path, typer.Option(help="a new or empty folder for the trajectories")],
    num_samples: Annotated[int, typer.Option(min=1, help="runs per example")] = 1,
    seed: Annotated[int, typer.Option(help="selection seed of the first sample")] = 42,
    profiling: Annotated[bool, typer.Option(help="print the latency summary")] = False,
    model: Annotated[str | None, typer.Option(help=MODEL_HELP)] = None,
    server: Annotated[str | None, typer.Option(help="run against a running server (URL) instead")] = None,
    world: Annotated[Path | None, typer.Option(help="tools over a world folder (corpus.jsonl and images/, "
                                                    "as `ssr-lab world build` writes; in process)")] = None,
    mode: Annotated[str, typer.Option(help="ssr | freeform")] = "ssr",
    library: Annotated[str, typer.Option()] = "default",
    tau: Annotated[float, typer.Option()] = DEFAULT_TAU,
    alpha: Annotated[float, typer.Option()] = DEFAULT_ALPHA,
    max_turns: Annotated[int, typer.Option(help="turns per run (8: the reference harness's budget)")] = 8,
    action_temperature: Annotated[float, typer.Option(help="0: greedy actions")] = 0.0,
    concurrency: Annotated[int, typer.Option(min=1)] = 1,
    api_key: Annotated[str | None, typer.Option(envvar="SSR_API_KEY")] = None,
) -> None:
    """Batch inference like the SSR reference harness: trajectories and a profiling summary."""
    from ssr_server.agent.loop import RunOptions
    from ssr_server.batch import infer as batch
    from ssr_server.batch.runner import LocalRunner, RemoteRunner
    from ssr_server.core.errors import InvalidRequest

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
        agent = await asyncio.to_thread(local_agent, make_settings(model=model), world)
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

"""Batch inference and evaluation on a world: ``ssr-server infer`` and ``ssr-server eval``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer

from ssr_server.cli.common import MODEL_HELP, local_agent, make_settings


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
    tau: Annotated[float, typer.Option(help="selection temperature (0: argmax; > 0 samples, seeded per "
                                            "question)")] = 0.0,
    alpha: Annotated[float, typer.Option(help="length normalisation of the candidates' scores "
                                              "(S = K^-alpha x sum of log-probs)")] = 1.0,
    seed: Annotated[int, typer.Option()] = 0,
    api_key: Annotated[str | None, typer.Option(envvar="SSR_API_KEY")] = None,
) -> None:
    """Task success, move accuracy and latency on a benchmark split, per question kind."""
    from ssr_server.agent.loop import RunOptions
    from ssr_server.batch.runner import LocalRunner, RemoteRunner, Runner
    from ssr_server.errors import InvalidRequest
    from ssr_server.eval.report import format_summary
    from ssr_server.eval.runner import run_eval, select_questions, write_eval
    from ssr_server.library import LibraryRegistry

    questions = select_questions(world, split, limit)
    if not questions:
        raise typer.BadParameter(f"no {split} questions in {world}")
    options = RunOptions(mode=mode, library=library, label_only=label_only, max_turns=max_turns,
                         reasoning_budget=reasoning_budget, tau=tau, alpha=alpha)
    try:
        options.validate()
    except InvalidRequest as exc:
        raise typer.BadParameter(str(exc)) from None
    settings = make_settings(model=model)
    lib = LibraryRegistry(settings.library_dirs).get(library)
    actions: dict[str, str] = {c.id: c.action for c in lib.candidates}
    meta: dict[str, Any] = {
        "world": str(world), "split": split, "mode": mode, "library": library, "label_only": label_only,
        "questions": len(questions), "max_turns": max_turns, "server": server, "model": model, "seed": seed,
        "tau": tau, "alpha": alpha}

    async def main() -> list[dict[str, Any]]:
        runner: Runner
        if server is not None:
            remote = RemoteRunner(server, api_key)
            try:
                return await run_eval(questions, remote, world, options, actions, concurrency=concurrency,
                                      seed=seed)
            finally:
                await remote.aclose()
        agent = await asyncio.to_thread(local_agent, settings, world)
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


def compare_command(
    eval_a: Annotated[Path, typer.Argument(exists=True, dir_okay=False,
                                           help="an `ssr-server eval --json` file (A, the baseline)")],
    eval_b: Annotated[Path, typer.Argument(exists=True, dir_okay=False,
                                           help="another, on the same questions (B)")],
    json_path: Annotated[Path | None, typer.Option("--json", help="write the comparison here too")] = None,
) -> None:
    """Two evals on the same questions, paired: each rate's interval, B - A with its interval, McNemar's p."""
    import json

    from ssr_server.errors import InvalidRequest
    from ssr_server.eval.compare import compare, format_comparison

    try:
        loaded = [json.loads(p.read_text(encoding="utf-8")) for p in (eval_a, eval_b)]
        result = compare(*loaded)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise typer.BadParameter(f"not an eval JSON: {exc}") from None
    except InvalidRequest as exc:
        raise typer.BadParameter(exc.message) from None
    if json_path is not None:
        json_path.write_text(json.dumps(result, indent=1), encoding="utf-8")
    typer.echo(format_comparison(result, str(eval_a), str(eval_b)))

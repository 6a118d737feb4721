"""Evaluation on a benchmark world and paired comparison: ``ssr-lab eval`` and ``ssr-lab compare``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer

from ssr_server.cli.common import MODEL_HELP, local_agent, make_settings
from ssr_server.core.limits import DEFAULT_MAX_TURNS
from ssr_server.core.selection import DEFAULT_ALPHA, DEFAULT_TAU


def eval_command(
    world: Annotated[Path, typer.Option(help="a `world build` folder (questions, corpus, image index)")],
    json_path: Annotated[Path, typer.Option("--json", help="every per-question record and the summary")],
    model: Annotated[str | None, typer.Option(help=MODEL_HELP)] = None,
    server: Annotated[str | None, typer.Option(help="a running server serving the same world")] = None,
    mode: Annotated[str, typer.Option(help="ssr | freeform")] = "ssr",
    split: Annotated[str, typer.Option(help="train | dev | test")] = "test",
    library: Annotated[str, typer.Option()] = "default",
    label_only: Annotated[bool, typer.Option(help="score only the candidates' labels (ablation)")] = False,
    limit: Annotated[int | None, typer.Option(help="at most N questions, round-robin on kinds")] = None,
    concurrency: Annotated[int, typer.Option(min=1)] = 1,
    max_turns: Annotated[int, typer.Option()] = DEFAULT_MAX_TURNS,
    reasoning_budget: Annotated[int, typer.Option(help="freeform: reasoning tokens per turn")] = 128,
    tau: Annotated[float, typer.Option(help="selection temperature (0: argmax; > 0 samples, seeded per "
                                            "question)")] = DEFAULT_TAU,
    alpha: Annotated[float, typer.Option(help="length normalisation of the candidates' scores "
                                              "(S = K^-alpha x sum of log-probs)")] = DEFAULT_ALPHA,
    seed: Annotated[int, typer.Option()] = 0,
    api_key: Annotated[str | None, typer.Option(envvar="SSR_API_KEY")] = None,
) -> None:
    """Task success, move accuracy and latency on a benchmark split, per question kind."""
    from ssr_lab.eval.report import format_summary
    from ssr_lab.eval.runner import run_eval, select_questions, write_eval
    from ssr_server.agent.loop import RunOptions
    from ssr_server.batch.runner import LocalRunner, RemoteRunner, Runner
    from ssr_server.core.errors import InvalidRequest
    from ssr_server.core.library import LibraryRegistry

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
                                           help="an `ssr-lab eval --json` file (A, the baseline)")],
    eval_b: Annotated[Path, typer.Argument(exists=True, dir_okay=False,
                                           help="another, on the same questions (B)")],
    json_path: Annotated[Path | None, typer.Option("--json", help="write the comparison here too")] = None,
) -> None:
    """Two evals on the same questions, paired: each rate's interval, B - A with its interval, McNemar's p."""
    import json

    from ssr_lab.eval.compare import compare, format_comparison
    from ssr_server.core.errors import InvalidRequest

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

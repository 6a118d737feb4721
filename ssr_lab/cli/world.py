"""``ssr-lab world``: the procedural benchmark world and its oracle trajectories."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from ssr_server.cli.common import make_settings

world_app = typer.Typer(no_args_is_help=True, help="The procedural benchmark world.")


@world_app.command("build")
def world_build(
    out_dir: Annotated[Path, typer.Argument(help="folder to write the world into")],
    entities: Annotated[int, typer.Option(help="invented entities (plus the fixed knowledge ones)")] = 5000,
    seed: Annotated[int, typer.Option()] = 0,
    processes: Annotated[int, typer.Option(help="drawing processes")] = 2,
    image_rank: Annotated[int, typer.Option(help="image search must list the entity within this rank")] = 1,
    preset: Annotated[str | None, typer.Option(
        help="demo: the preset the server ships (36 entities, its fixed seed; --entities and --seed unused)")
    ] = None,
) -> None:
    """Entities, corpus, image index, question images and questions with gold moves; same seed, same bytes."""
    from ssr_lab.world import build_world
    from ssr_lab.world.demo import DEMO_ENTITIES, DEMO_SEED
    from ssr_server.core.errors import InvalidRequest

    if preset not in (None, "demo"):
        raise typer.BadParameter(f"--preset takes demo, not {preset!r}")
    if preset == "demo":
        entities, seed, processes = DEMO_ENTITIES, DEMO_SEED, 1
    try:
        report = build_world(out_dir, entities, seed, processes=processes, progress=True,
                             image_rank=image_rank)
    except InvalidRequest as exc:
        raise typer.BadParameter(exc.message) from None
    typer.echo(report.summary())


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
    from ssr_lab.eval.trajectories import write_trajectories

    n, problems = asyncio.run(write_trajectories(world, out, mode=mode, split=split, limit=limit,
                                                 settings=make_settings(model=model)))
    typer.echo(f"{n} trajectories written to {out}; oracle replay success {n - problems}/{n}")
    if problems:
        raise typer.Exit(1)

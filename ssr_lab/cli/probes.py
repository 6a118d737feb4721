"""``ssr-lab train probe`` and ``train probe-features``: does a model read its pictures, and where not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ssr_lab.cli.train import zoom_style
from ssr_server.cli.common import make_settings


def _check_world(world: Path, split: str) -> None:
    if split not in ("train", "dev", "test"):
        raise typer.BadParameter("split must be train, dev or test")
    if not (world / "questions.jsonl").is_file():
        raise typer.BadParameter(f"{world} is not a built world (no questions.jsonl)")


def train_probe_command(
    world: Annotated[Path, typer.Option(help="a `world build` folder")],
    model: Annotated[str | None, typer.Option(help="model dir (default: the shipped model)")] = None,
    split: Annotated[str, typer.Option(help="train | dev | test: whose visual/detail trajectories")] = "test",
    drills: Annotated[int, typer.Option(min=2, help="reading drills drawn")] = 128,
    seed: Annotated[int, typer.Option()] = 12345,
    threads: Annotated[int | None, typer.Option(help="torch threads (default: all cores)")] = None,
    json_path: Annotated[str | None, typer.Option("--json", help="write the figures as JSON")] = None,
    zoom: Annotated[str, typer.Option(help="the zoom style detail drills use: tight, strip or wide (as the "
                                           "model was trained: `train sft`'s zoom)")] = "tight",
) -> None:
    """Does the model read its pictures? Teacher-forced answers on fresh pictures vs another drill's."""
    from ssr_lab.train.reading_probe import ProbeConfig, format_probe, run_probe
    from ssr_server.engine.factory import resolve_model

    _check_world(world, split)
    try:
        result = run_probe(ProbeConfig(world=world, model=resolve_model(make_settings(model=model)),
                                       split=split, drills=drills, seed=seed, threads=threads,
                                       zoom=zoom_style(zoom)))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=1), encoding="utf-8")
    typer.echo(format_probe(result))


def train_probe_features_command(
    world: Annotated[Path, typer.Option(help="a `world build` folder")],
    model: Annotated[str | None, typer.Option(help="model dir (default: the shipped model)")] = None,
    split: Annotated[str, typer.Option(help="train | dev | test: whose visual/detail questions")] = "test",
    attribute: Annotated[list[str] | None, typer.Option(
        help="colour, count, shape, char (visual) or plaque (detail); repeatable (default: all)")] = None,
    drills: Annotated[int, typer.Option(min=10, help="fresh-picture drills per attribute")] = 1000,
    folds: Annotated[int, typer.Option(min=2, help="cross-validation folds")] = 5,
    steps: Annotated[int, typer.Option(min=1, help="optimizer steps of each fold's probe")] = 1500,
    seed: Annotated[int, typer.Option()] = 12345,
    threads: Annotated[int | None, typer.Option(help="torch threads (default: all cores)")] = None,
    json_path: Annotated[str | None, typer.Option("--json", help="write the figures as JSON")] = None,
    zoom: Annotated[str, typer.Option(help="the zoom style detail drills use (as the model was trained)")] = (
        "wide"),
    zoom_jitter: Annotated[float, typer.Option(min=0.0, help="detail crops moved sideways by up to this many "
                                                        "gold-box widths, as a model's own boxes are")] = 0.0,
    zoom_edge_jitter: Annotated[float, typer.Option(
        min=0.0, max=0.5, help="then each crop edge by up to this share of the gold box's size")] = 0.0,
) -> None:
    """Where is a picture's answer lost? Probes on the tower's tokens and at the answer, against the model."""
    from ssr_lab.train.feature_probe import (
        ATTRIBUTES,
        FeatureProbeConfig,
        format_feature_probe,
        run_feature_probe,
    )
    from ssr_server.engine.factory import resolve_model

    _check_world(world, split)
    try:
        result = run_feature_probe(FeatureProbeConfig(
            world=world, model=resolve_model(make_settings(model=model)), split=split,
            attributes=tuple(attribute or ATTRIBUTES), drills=drills, folds=folds, steps=steps, seed=seed,
            threads=threads, zoom=zoom_style(zoom), zoom_jitter=zoom_jitter,
            zoom_edge_jitter=zoom_edge_jitter))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=1), encoding="utf-8")
    typer.echo(format_feature_probe(result))

"""``ssr-lab train``: pretraining, SFT, the vision tower, reading probes and SSR-GRPO.

The four training commands take a recipe: a YAML file of their config's fields (``ssr-lab train
recipe-fields COMMAND`` lists them with their types, defaults and help), which may ``extends:`` another,
and ``--set key=value`` pairs over it. The config dataclass is the one list of fields and checks; this
module only reads the recipe, shows a refusal as a usage error, and writes the resolved recipe beside the
model (``OUT/recipe.yaml``) so that the run's folder says all it ran with.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

train_app = typer.Typer(no_args_is_help=True, help="Train a selector: SFT and SSR-GRPO on a world.")

RECIPE_COMMANDS = ("sft", "vision", "pretrain", "grpo")

Recipe = Annotated[Path, typer.Option("--recipe", metavar="FILE", help=(
    "a YAML recipe: the config's fields (`ssr-lab train recipe-fields COMMAND` lists them), `extends: "
    "FILE` to start from another recipe"))]
Sets = Annotated[list[str] | None, typer.Option("--set", metavar="KEY=VALUE", help=(
    "a field over the recipe, its value read as YAML (`--set steps=1`, `--set repeat={visual: 2}`); "
    "repeatable"))]
Show = Annotated[bool, typer.Option("--show", help="print the resolved recipe (every field) and stop")]


def zoom_style(text: str) -> str:
    from ssr_lab.world.views import check_zoom_style

    try:
        return check_zoom_style(text)
    except ValueError as exc:
        raise typer.BadParameter(f"--zoom: {exc}") from None


def recipe_config(command: str) -> type[Any]:
    """The config dataclass a training command's recipe is read into."""
    if command == "sft":
        from ssr_lab.train.config.sft import SFTConfig

        return SFTConfig
    if command == "vision":
        from ssr_lab.train.config.vision import VisionConfig

        return VisionConfig
    if command == "pretrain":
        from ssr_lab.train.config.pretrain import PretrainConfig

        return PretrainConfig
    if command == "grpo":
        from ssr_lab.train.config.grpo import GRPOConfig

        return GRPOConfig
    raise typer.BadParameter(f"{command!r}: one of {', '.join(RECIPE_COMMANDS)}")


def _config(command: str, recipe: Path, sets: list[str] | None) -> Any:
    from ssr_lab.train.config.recipe import RecipeError, load

    try:
        return load(recipe_config(command), recipe, sets or [])
    except RecipeError as exc:
        raise typer.BadParameter(str(exc)) from None


def _shown(cfg: Any, show: bool) -> bool:
    """With ``--show``, print the resolved recipe (and train nothing); else keep it as ``OUT/recipe.yaml``."""
    from ssr_lab.train.config.recipe import dump

    text = dump(cfg)
    if show:
        typer.echo(text, nl=False)
        return True
    cfg.out.mkdir(parents=True, exist_ok=True)
    (cfg.out / "recipe.yaml").write_text(text, encoding="utf-8")
    return False


def _report_training(figures: dict[str, Any], out: Path) -> None:
    typer.echo(json.dumps(figures, indent=1, default=str))
    typer.echo(f"model written to {out}")


@train_app.command("sft")
def train_sft_command(recipe: Recipe, sets: Sets = None, show: Show = False) -> None:
    """Supervised training on the world's oracle trajectories (loss on assistant tokens only)."""
    from ssr_lab.train import sft

    cfg = _config("sft", recipe, sets)
    if not _shown(cfg, show):
        _report_training(sft.train_sft(cfg), cfg.out)


@train_app.command("vision")
def train_vision_command(recipe: Recipe, sets: Sets = None, show: Show = False) -> None:
    """Train the vision tower on freshly drawn pictures (heads on what questions read, not kept)."""
    from ssr_lab.train import vision

    cfg = _config("vision", recipe, sets)
    if not show and not (cfg.init / "config.json").is_file():
        raise typer.BadParameter(f"init: {cfg.init} is not a model folder (no config.json)")
    if not _shown(cfg, show):
        _report_training(vision.train_vision(cfg), cfg.out)


@train_app.command("pretrain")
def train_pretrain_command(recipe: Recipe, sets: Sets = None, show: Show = False) -> None:
    """Next-token pretraining of a fresh model on the training entities' corpus (the base for SFT)."""
    from ssr_lab.train import pretrain

    cfg = _config("pretrain", recipe, sets)
    if not _shown(cfg, show):
        _report_training(pretrain.train_pretrain(cfg), cfg.out)


@train_app.command("grpo")
def train_grpo_command(recipe: Recipe, sets: Sets = None, show: Show = False) -> None:
    """GRPO through the real agent loop; SSR turns contribute one categorical ratio each."""
    from ssr_lab.train import grpo

    cfg = _config("grpo", recipe, sets)
    if not _shown(cfg, show):
        _report_training(grpo.train_grpo(cfg), cfg.out)


@train_app.command("recipe-fields")
def recipe_fields_command(
    command: Annotated[str, typer.Argument(help=f"the training command: {' | '.join(RECIPE_COMMANDS)}")],
) -> None:
    """The keys a training command's recipe takes: each one's type, default and what it does."""
    from ssr_lab.train.config.describe import format_fields

    cls = recipe_config(command)
    typer.echo(f"# ssr-lab train {command} --recipe FILE [--set KEY=VALUE ...]: the recipe's keys "
               f"({cls.__name__})\n")
    typer.echo(format_fields(cls))


@train_app.command("soup")
def train_soup_command(
    models: Annotated[list[Path], typer.Argument(help="model folders tuned from one start (two or more)")],
    out: Annotated[Path, typer.Option(help="where the averaged model goes")],
    weights: Annotated[str | None, typer.Option(help="comma-separated mixing weights, one per model "
                                                     "(normalised; default: uniform)")] = None,
) -> None:
    """Average the weights of models fine-tuned from one start (a model soup)."""
    from ssr_lab.train.soup import SoupError, soup

    try:
        mix = [float(w) for w in weights.split(",")] if weights else None
    except ValueError:
        raise typer.BadParameter("--weights takes numbers such as 0.5,0.5") from None
    try:
        figures = soup(models, out, mix)
    except SoupError as exc:
        raise typer.BadParameter(str(exc)) from None
    _report_training(figures, out)

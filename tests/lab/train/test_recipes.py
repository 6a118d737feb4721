"""The shipped recipes: each resolves, and the ssr-tiny lineage is the commands that built the shipped model.

``ssr_server/models/ssr-tiny/ssr_tiny.json`` records those commands in the CLI of the time (one option per
field). Its options are read back here by that CLI's rules (``--x-y V`` is field ``x_y``, ``--flag`` true,
``--no-flag`` false, ``--repeat KIND=N`` repeatable) over the config's defaults, and each lineage recipe must
resolve to exactly that config.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import ssr_lab
import ssr_server
from ssr_lab.cli import app
from ssr_lab.cli.train import recipe_config
from ssr_lab.train.config.recipe import as_recipe, load
from ssr_lab.train.config.sft import SFTConfig
from ssr_lab.train.config.vision import VisionConfig

RECIPES = Path(ssr_lab.__file__).parent / "recipes"
ROOT = RECIPES.parent.parent  # the lineage's command lines run from the repository root
LINEAGE = RECIPES / "ssr-tiny"
SHIPPED = Path(ssr_server.__file__).parent / "models" / "ssr-tiny"


def bash_lines(readme: Path) -> list[str]:
    """The command lines of a markdown file's ```bash blocks."""
    blocks = re.findall(r"```bash\n(.*?)```", readme.read_text(encoding="utf-8"), re.S)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def recorded() -> list[str]:
    return [str(c) for c in json.loads((SHIPPED / "ssr_tiny.json").read_text())["commands"]]


def recipe_lines() -> list[list[str]]:
    """Every ``ssr-lab train COMMAND --recipe FILE ...`` line of the recipes' READMEs, split."""
    readmes = sorted(RECIPES.rglob("README.md"))
    lines = [shlex.split(line) for readme in readmes for line in bash_lines(readme)]
    return [argv for argv in lines if argv[1] == "train" and "--recipe" in argv]


def recorded_fields(command: str) -> dict[str, Any]:
    """The fields a recorded ``ssr-server train sft|vision ...`` line stated, by its CLI's rules."""
    argv = shlex.split(command)[3:]
    fields: dict[str, Any] = {}
    repeat: dict[str, int] = {}
    while argv:
        name = argv.pop(0).removeprefix("--").replace("-", "_")
        if argv and not argv[0].startswith("--"):
            value = argv.pop(0)
            if name == "repeat":
                kind, _, n = value.partition("=")
                repeat[kind] = int(n)
            else:
                fields[name] = value
        else:
            fields[name.removeprefix("no_")] = not name.startswith("no_")
    return {**fields, "repeat": repeat} if repeat else fields


def test_every_recipe_is_run_by_a_readme_line_that_resolves_through_the_cli() -> None:
    lines = recipe_lines()
    named = sorted(ROOT / argv[argv.index("--recipe") + 1] for argv in lines)
    assert named == sorted(RECIPES.rglob("*.yaml"))  # each recipe once; each says by which command
    for argv in lines:
        path = ROOT / argv[argv.index("--recipe") + 1]
        args = [a if a != str(path.relative_to(ROOT)) else str(path) for a in argv[1:]]
        result = CliRunner().invoke(app, [*args, "--show"])
        assert result.exit_code == 0, (argv, result.output)
        sets = [a for i, a in enumerate(args) if i and args[i - 1] == "--set"]
        assert yaml.safe_load(result.output) == as_recipe(load(recipe_config(argv[2]), path, sets))


def test_the_lineage_is_the_recorded_commands_step_by_step() -> None:
    lines, commands = bash_lines(LINEAGE / "README.md"), recorded()
    assert len(lines) == len(commands) == 39
    recipes = 0
    for line, command in zip(lines, commands, strict=True):
        argv, old = shlex.split(line), shlex.split(command)
        assert (argv[0], old[0]) == ("ssr-lab", "ssr-server")
        if argv[1:3] not in (["train", "sft"], ["train", "vision"]):  # the world and the soups: as recorded
            assert argv[1:] == old[1:], line
            continue
        assert argv[1:3] == old[1:3] and argv[3] == "--recipe", line
        cls = recipe_config(argv[2])
        cfg = load(cls, ROOT / argv[4])
        assert cfg == cls(**recorded_fields(command)), line
        # the one thing a line adds: the model an `--init ssr_server/models/ssr-tiny` of its time meant
        assert argv[5:] in ([], ["--set", argv[-1]]) and (not argv[5:] or (
            argv[-1].startswith("init=runs/") or argv[-1].startswith("init=/work/runs/"))), line
        assert bool(argv[5:]) == (str(cfg.init) == "ssr_server/models/ssr-tiny"), line
        recipes += 1
    assert recipes == 35


R51 = {
    "world": Path("/work/worlds/w5000"), "out": Path("runs/R51"), "format": "ssr", "init": "runs/R50",
    "library": "default", "label_only": False, "steps": 1400, "batch_size": 16, "lr": 7e-4,
    "min_lr_ratio": 0.1, "warmup": 100, "weight_decay": 0.01, "clip": 1.0, "seed": 103, "limit": None,
    "paraphrases": 2, "max_minutes": 28.0, "anneal_by_time": True, "save_every": 250, "log_every": 10,
    "threads": 2, "cache_examples": True, "rename": True, "drills": True, "drill_sizes": (1, 2),
    "drill_calls": "all", "drills_repeat": True, "rephrase": 0.5, "rephrase_pictures": True,
    "rephrase_refs": True, "rephrase_openings": True, "drill_contrast": True, "copy_every": 8,
    "copy_warmup": 0, "copy_batch": 32,
    "repeat": (("two_hop", 8), ("search", 2), ("knowledge", 2), ("detail", 2), ("visual", 2)),
    "pictures_every": 2, "pictures_batch": 32, "picture_moves": True, "freeze_vision": False, "zoom": "wide",
    "zoom_jitter": 1.0, "zoom_edge_jitter": 0.1, "zoom_retry": 0.5, "zoom_sign": True,
    "zoom_sign_on": ("shape", "char"), "zoom_count": False, "search_count": True, "grow_layers": 0,
    "vision_lr_scale": 0.2,
}
# R54: S53 (the soup of R51 and R52) + R51's recipe with the language model at half the rate, the tower at
# the full one, seed 106
R54 = {**R51, "out": Path("runs/R54"), "init": "runs/S53", "lr": 3.5e-4, "seed": 106, "vision_lr_scale": 1.0}
V20 = {
    "init": Path("runs/R20"), "out": Path("runs/V20"), "steps": 320, "batch_size": 32, "lr": 5e-4,
    "warmup": 50, "weight_decay": 0.01, "reinit": False, "grow": 0, "seed": 34, "threads": 2,
    "max_minutes": 13.0, "log_every": 25, "eval_pictures": 256,
    "heads": ("colour", "count", "sign", "plaque", "known", "plaque_x", "plaque_y"), "known_share": 0.3,
    "anchor": 2.0, "anchor_crops": 0.5, "image_pixels": None, "max_pixels": 131072, "zoom": "wide",
    "zoom_jitter": 1.2, "zoom_edge_jitter": 0.0,
}


@pytest.mark.parametrize(("recipe", "cls", "want"), [
    ("r51.yaml", SFTConfig, R51), ("r54.yaml", SFTConfig, R54), ("v20.yaml", VisionConfig, V20)])
def test_lineage_recipes_resolve_to_their_recorded_configs(recipe: str, cls: type[Any],
                                                           want: dict[str, Any]) -> None:
    cfg = load(cls, LINEAGE / recipe)
    got = {name: getattr(cfg, name) for name in cfg.__dataclass_fields__}
    assert got == want
    assert {k: type(v) for k, v in got.items()} == {k: type(v) for k, v in want.items()}


def test_the_model_cards_reproduce_block_is_the_lineages_last_steps() -> None:
    card = bash_lines(SHIPPED / "README.md")
    assert len(card) >= 4 and card == bash_lines(LINEAGE / "README.md")[-len(card):]
    text = (SHIPPED / "README.md").read_text(encoding="utf-8")
    assert "ssr-server train" not in text and "ssr-server eval" not in text  # now `ssr-lab`'s commands

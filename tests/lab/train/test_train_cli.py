"""``ssr-lab train sft | vision | pretrain | grpo --recipe FILE [--set KEY=VALUE]``: a recipe's fields reach
the configs; a bad recipe is refused before any work, as a usage error naming the field."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner, Result

from ssr_lab.cli import app
from ssr_lab.train.config.recipe import dump
from ssr_lab.train.config.sft import SFTConfig

Invoke = Callable[..., Result]


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The config of every training command the test invokes, in order (the training itself not run)."""
    from ssr_lab.train import grpo, pretrain, sft, vision

    configs: list[Any] = []
    for module, name in ((sft, "train_sft"), (vision, "train_vision"), (grpo, "train_grpo"),
                         (pretrain, "train_pretrain")):
        monkeypatch.setattr(module, name, lambda cfg: configs.append(cfg) or {})
    monkeypatch.setattr("ssr_lab.cli.train._report_training", lambda figures, out: None)
    return configs


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    return tmp_path / "m"


@pytest.fixture
def train(tmp_path: Path, model_dir: Path) -> Invoke:
    """``ssr-lab train COMMAND`` with a recipe of ``fields`` over the required ones, and ``--set`` pairs."""
    required = {"sft": {"world": str(tmp_path), "out": str(tmp_path / "o")},
                "vision": {"init": str(model_dir), "out": str(tmp_path / "o")},
                "pretrain": {"world": str(tmp_path), "out": str(tmp_path / "o")},
                "grpo": {"world": str(tmp_path), "init": str(model_dir), "out": str(tmp_path / "o")}}

    def invoke(command: str, *sets: str, **fields: Any) -> Result:
        recipe = tmp_path / f"{command}.yaml"
        recipe.write_text(yaml.safe_dump({**required[command], **fields}))
        return CliRunner().invoke(app, ["train", command, "--recipe", str(recipe),
                                        *(arg for pair in sets for arg in ("--set", pair))])

    return invoke


def refused(result: Result, *names: str) -> bool:
    """A usage error (exit 2, no traceback) whose message names every one of ``names``."""
    # the error box wraps (and may fold a long path), so compare without its borders and white space
    text = "".join(result.output.replace("│", "").split())
    return result.exit_code == 2 and isinstance(result.exception, SystemExit) \
        and all("".join(name.split()) in text for name in names)


def test_sft_refuses_copying_every_single_step(tmp_path: Path, train: Invoke, seen: list[Any]) -> None:
    result = train("sft", copy_every=1)
    assert refused(result, "copy_every"), result.output
    assert not (tmp_path / "o").exists() and not seen


def test_sft_passes_a_reading_phase_and_annealing_by_time(train: Invoke, seen: list[Any]) -> None:
    result = train("sft", pictures_every=1, picture_moves=False, anneal_by_time=True, freeze_vision=True)
    assert result.exit_code == 0, result.output
    train("sft")
    passed = [(cfg.pictures_every, cfg.picture_moves, cfg.anneal_by_time, cfg.freeze_vision) for cfg in seen]
    assert passed == [(1, False, True, True), (0, True, False, False)]


def test_sft_passes_the_picture_rephrasings_and_refuses_them_without_a_share(train: Invoke,
                                                                             seen: list[Any]) -> None:
    result = train("sft", rephrase=0.5, rephrase_pictures=True, rephrase_refs=True, rephrase_openings=True)
    assert result.exit_code == 0, result.output
    assert (seen[0].rephrase, seen[0].rephrase_pictures, seen[0].rephrase_refs,
            seen[0].rephrase_openings) == (0.5, True, True, True)
    for field in ("rephrase_pictures", "rephrase_refs"):
        assert refused(train("sft", **{field: True}), field, "rephrase") and len(seen) == 1, field
    result = train("sft", rephrase=0.5, rephrase_openings=True)
    assert refused(result, "rephrase_openings", "rephrase_pictures")
    train("sft")
    assert not (seen[1].rephrase_pictures or seen[1].rephrase_refs or seen[1].rephrase_openings)


def test_grpo_passes_the_rollout_temperatures_and_refuses_tau_zero(train: Invoke, seen: list[Any]) -> None:
    result = train("grpo", tau=0.05, temperature=0.5)
    assert result.exit_code == 0, result.output
    assert (seen[0].tau, seen[0].temperature) == (0.05, 0.5)
    train("grpo")
    assert (seen[1].tau, seen[1].temperature) == (1.0, 1.0)  # the defaults
    assert (seen[1].kinds, seen[1].freeze_vision) == ((), False)
    assert refused(train("grpo", tau=0), "tau") and len(seen) == 2
    result = train("grpo", kinds=["detail", "visual"], freeze_vision=True)
    assert result.exit_code == 0, result.output
    assert (seen[2].kinds, seen[2].freeze_vision) == (("detail", "visual"), True)
    assert (seen[2].anchor, seen[2].anchor_zoom) == (0.0, "tight")
    train("grpo", anchor=0.5, anchor_zoom="wide", anchor_rename=True, anchor_rephrase=0.5)
    assert (seen[3].anchor, seen[3].anchor_batch, seen[3].anchor_zoom) == (0.5, 16, "wide")
    assert (seen[3].anchor_rename, seen[3].anchor_rephrase, seen[2].anchor_rename) == (True, 0.5, False)
    for field, bad in (("kinds", ["details"]), ("anchor_zoom", "wider"), ("anchor", -1),
                       ("format", "prose"), ("selector_grad", "some"), ("ratio_level", "batch")):
        assert refused(train("grpo", **{field: bad}), field) and len(seen) == 4, field


def test_sft_and_vision_pass_the_zoom_style_and_refuse_an_unknown_one(train: Invoke, seen: list[Any]) -> None:
    for command in ("sft", "vision"):
        result = train(command, zoom="strip")
        assert result.exit_code == 0, result.output
        assert seen.pop().zoom == "strip"
        train(command)
        default = seen.pop()
        assert default.zoom == "tight" and default.zoom_jitter == 0.0 and default.zoom_edge_jitter == 0.0
        train(command, zoom="wide", zoom_jitter=1.2, zoom_edge_jitter=0.1)
        passed = seen.pop()
        assert passed.zoom_jitter == 1.2 and passed.zoom_edge_jitter == 0.1
        assert refused(train(command, zoom_jitter=-1), "zoom_jitter") and not seen
        assert refused(train(command, zoom="huge"), "zoom", "huge") and not seen
    train("sft", zoom_sign=True, zoom_count=True)
    assert (seen[0].zoom_sign, seen[0].zoom_count) == (True, True)
    train("vision", max_pixels=131072)
    assert seen[1].max_pixels == 131072


def test_sft_passes_the_sign_zoom_the_count_search_and_the_grown_layers_and_refuses_bad_values(
        train: Invoke, seen: list[Any]) -> None:
    result = train("sft", zoom_sign=True, zoom_sign_on=["char"], grow_layers=2, search_count=True)
    assert result.exit_code == 0, result.output
    assert (seen[0].zoom_sign, seen[0].zoom_sign_on, seen[0].grow_layers) == (True, ("char",), 2)
    assert (seen[0].search_count, seen[0].zoom_count) == (True, False)
    train("sft", zoom_sign=True)
    assert (seen[1].zoom_sign_on, seen[1].grow_layers, seen[1].search_count) == (("shape", "char"), 0, False)
    for bad in ({"zoom_sign_on": ["colour"]}, {"zoom_sign_on": []}, {"zoom_sign_on": ["char", "count"]},
                {"grow_layers": -1}, {"search_count": True, "zoom_count": True}):
        assert refused(train("sft", **bad), *bad) and len(seen) == 2, bad


def test_sft_passes_the_towers_learning_rate_share_and_refuses_it_with_a_frozen_tower(
        train: Invoke, seen: list[Any]) -> None:
    assert train("sft", vision_lr_scale=0.2).exit_code == 0
    train("sft")
    assert [cfg.vision_lr_scale for cfg in seen] == [0.2, 1.0]
    for bad in ({"vision_lr_scale": 0.2, "freeze_vision": True}, {"vision_lr_scale": 0},
                {"vision_lr_scale": 1.5}):
        assert refused(train("sft", **bad), "vision_lr_scale") and len(seen) == 2, bad


def test_vision_refuses_unknown_heads_and_an_init_that_is_not_a_model(tmp_path: Path, train: Invoke,
                                                                       seen: list[Any]) -> None:
    result = train("vision", heads=["colour", "known"])
    assert result.exit_code == 0, result.output
    assert seen[0].heads == ("colour", "known")
    assert refused(train("vision", heads=["colour", "size"]), "heads", "size")
    assert refused(train("vision", init=str(tmp_path)), "init", "config.json") and len(seen) == 1


def test_pretrain_reads_its_recipe(train: Invoke, seen: list[Any]) -> None:
    assert train("pretrain", seq_len=128, rename=False).exit_code == 0
    assert (seen[0].seq_len, seen[0].rename, seen[0].init) == (128, False, "128x4-tied")
    assert refused(train("pretrain", seq_len=4), "seq_len")


def test_an_unknown_key_is_refused_with_the_known_ones(tmp_path: Path, train: Invoke,
                                                       seen: list[Any]) -> None:
    result = train("sft", stepz=10)
    assert refused(result, "stepz", "known keys", "steps", "vision_lr_scale"), result.output
    assert refused(train("sft", "stepz=10"), "--set", "stepz", "known keys")
    assert refused(train("sft", "steps"), "--set", "KEY=VALUE")
    assert not seen and not (tmp_path / "o").exists()


def test_a_missing_field_is_named(tmp_path: Path, seen: list[Any]) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"world: {tmp_path}\n")
    result = CliRunner().invoke(app, ["train", "sft", "--recipe", str(recipe)])
    assert refused(result, "out", "required") and not seen


def test_set_overrides_the_recipe_with_yaml_values(train: Invoke, seen: list[Any]) -> None:
    result = train("sft", "steps=7", "lr=7e-4", "repeat={two_hop: 8, search: 2}", "drill_sizes=[1, 2]",
                   "limit=null", "zoom_sign_on=char", "rename=true",
                   steps=3, limit=10, repeat={"visual": 2})
    assert result.exit_code == 0, result.output
    cfg = seen[0]
    assert (cfg.steps, cfg.lr, cfg.limit, cfg.rename) == (7, 7e-4, None, True)
    assert cfg.repeat == (("two_hop", 8), ("search", 2))  # a mapping replaces the recipe's, not merged
    assert (cfg.drill_sizes, cfg.zoom_sign_on) == ((1, 2), ("char",))
    assert refused(train("sft", "steps=many"), "steps") and len(seen) == 1


def test_extends_reads_the_parent_relative_to_the_recipe_and_the_child_wins(tmp_path: Path,
                                                                           seen: list[Any]) -> None:
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "parent.yaml").write_text(
        f"world: {tmp_path}\nout: {tmp_path / 'p'}\nsteps: 10\nlr: 0.002\nrepeat: {{visual: 2, detail: 2}}\n")
    (tmp_path / "lineage").mkdir()
    child = tmp_path / "lineage" / "child.yaml"
    child.write_text(f"extends: ../base/parent.yaml\nout: {tmp_path / 'c'}\nlr: 0.001\n"
                     "repeat: {search: 2}\n")
    grandchild = tmp_path / "lineage" / "grandchild.yaml"
    grandchild.write_text("extends: child.yaml\nseed: 3\n")
    result = CliRunner().invoke(app, ["train", "sft", "--recipe", str(grandchild), "--set", "steps=20"])
    assert result.exit_code == 0, result.output
    cfg = seen[0]
    assert (cfg.world, cfg.out, cfg.steps, cfg.lr, cfg.seed) == (tmp_path, tmp_path / "c", 20, 0.001, 3)
    assert cfg.repeat == (("search", 2),)


def test_an_extends_cycle_is_refused(tmp_path: Path, seen: list[Any]) -> None:
    (tmp_path / "a.yaml").write_text(f"extends: b.yaml\nworld: {tmp_path}\n")
    (tmp_path / "b.yaml").write_text(f"extends: a.yaml\nout: {tmp_path / 'o'}\n")
    (tmp_path / "self.yaml").write_text("extends: self.yaml\n")
    for name in ("a.yaml", "self.yaml"):
        result = CliRunner().invoke(app, ["train", "sft", "--recipe", str(tmp_path / name)])
        assert refused(result, "extends itself", name), result.output
    result = CliRunner().invoke(app, ["train", "sft", "--recipe", str(tmp_path / "none.yaml")])
    assert refused(result, "none.yaml") and not seen


def test_a_recipe_run_gets_the_config_written_directly(tmp_path: Path, train: Invoke,
                                                       seen: list[Any]) -> None:
    direct = SFTConfig(world=tmp_path, out=tmp_path / "o", init="64x2", steps=12, lr=7e-4, rename=True,
                       drills=True, drill_sizes=(1, 2), drill_calls="all",
                       repeat=(("two_hop", 8), ("visual", 2)), zoom="wide", zoom_sign=True,
                       zoom_sign_on=("char",), pictures_every=2)
    result = train("sft", init="64x2", steps=12, lr=7e-4, rename=True, drills=True, drill_sizes=[1, 2],
                   drill_calls="all", repeat={"two_hop": 8, "visual": 2}, zoom="wide", zoom_sign=True,
                   zoom_sign_on=["char"], pictures_every=2)
    assert result.exit_code == 0, result.output
    assert seen == [direct]
    # the folder keeps the resolved recipe, which makes the same config again
    kept = tmp_path / "o" / "recipe.yaml"
    assert kept.read_text() == dump(direct)
    assert CliRunner().invoke(app, ["train", "sft", "--recipe", str(kept)]).exit_code == 0
    assert seen == [direct, direct]


def test_show_prints_the_resolved_recipe_and_trains_nothing(tmp_path: Path, train: Invoke,
                                                            seen: list[Any]) -> None:
    result = train("sft", "seed=4", repeat={"two_hop": 8})
    assert result.exit_code == 0 and seen
    result = CliRunner().invoke(app, ["train", "sft", "--recipe", str(tmp_path / "sft.yaml"),
                                      "--set", "seed=4", "--show"])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.output)["repeat"] == {"two_hop": 8}
    assert result.output == dump(seen[0]) and len(seen) == 1


@pytest.mark.parametrize("command", ["sft", "vision", "pretrain", "grpo"])
def test_recipe_fields_lists_every_field_with_its_help(command: str) -> None:
    from ssr_lab.cli.train import recipe_config
    from ssr_lab.train.config.recipe import field_names

    result = CliRunner().invoke(app, ["train", "recipe-fields", command])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    names = [line.split(":", 1)[0] for line in lines if line and not line.startswith((" ", "#"))]
    assert names == list(field_names(recipe_config(command)))
    described = [lines[i + 1] for i, line in enumerate(lines) if line and not line.startswith((" ", "#"))]
    assert all(d.startswith("    ") and d.strip() for d in described)  # every field has its help
    if command == "sft":
        assert "repeat: {KIND: N, ...}; default {}" in lines
        assert "zoom: tight | strip | wide | coarse; default tight" in lines
    result = CliRunner().invoke(app, ["train", "recipe-fields", "soup"])
    assert refused(result, "soup", "sft")

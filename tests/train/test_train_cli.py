"""``ssr-server train sft | grpo``: options reach the configs; bad values are refused before any work."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ssr_server.cli import app


@pytest.fixture
def sft_configs(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The SFTConfig of every `train sft` the test invokes, in order (the training itself not run)."""
    from ssr_server.train import sft

    seen: list[Any] = []
    monkeypatch.setattr(sft, "train_sft", lambda cfg: seen.append(cfg) or {})
    monkeypatch.setattr("ssr_server.cli.train._report_training", lambda figures, out: None)
    return seen


def test_sft_refuses_copying_every_single_step(tmp_path: Path) -> None:
    args = ["train", "sft", "--world", str(tmp_path), "--out", str(tmp_path / "o"), "--copy-every", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "--copy-every" in result.output
    assert not (tmp_path / "o").exists()


def test_sft_passes_a_reading_phase_and_annealing_by_time(tmp_path: Path,
                                                          sft_configs: list[Any]) -> None:
    seen = sft_configs
    base = ["train", "sft", "--world", str(tmp_path), "--out", str(tmp_path / "o")]
    flags = ["--pictures-every", "1", "--no-picture-moves", "--anneal-by-time", "--freeze-vision"]
    result = CliRunner().invoke(app, [*base, *flags])
    assert result.exit_code == 0, result.output
    cfg = seen[0]
    assert (cfg.pictures_every, cfg.picture_moves, cfg.anneal_by_time, cfg.freeze_vision) == (
        1, False, True, True)
    CliRunner().invoke(app, base)
    cfg = seen[1]
    assert (cfg.pictures_every, cfg.picture_moves, cfg.anneal_by_time, cfg.freeze_vision) == (
        0, True, False, False)


def test_sft_passes_the_picture_rephrasings_and_refuses_them_without_a_share(
        tmp_path: Path, sft_configs: list[Any]) -> None:
    seen = sft_configs
    base = ["train", "sft", "--world", str(tmp_path), "--out", str(tmp_path / "o")]
    result = CliRunner().invoke(app, [*base, "--rephrase", "0.5", "--rephrase-pictures", "--rephrase-refs",
                                      "--rephrase-openings"])
    assert result.exit_code == 0, result.output
    assert (seen[0].rephrase, seen[0].rephrase_pictures, seen[0].rephrase_refs,
            seen[0].rephrase_openings) == (0.5, True, True, True)
    for flag in ("--rephrase-pictures", "--rephrase-refs"):
        result = CliRunner().invoke(app, [*base, flag])
        assert result.exit_code == 2 and flag in result.output and len(seen) == 1, flag
    result = CliRunner().invoke(app, [*base, "--rephrase", "0.5", "--rephrase-openings"])
    assert result.exit_code == 2 and "--rephrase-pictures" in result.output and len(seen) == 1
    CliRunner().invoke(app, base)
    assert not (seen[1].rephrase_pictures or seen[1].rephrase_refs or seen[1].rephrase_openings)


def test_grpo_passes_the_rollout_temperatures_and_refuses_tau_zero(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from ssr_server.train import grpo

    seen: list[Any] = []
    monkeypatch.setattr(grpo, "train_grpo", lambda cfg: seen.append(cfg) or {})
    base = ["train", "grpo", "--world", str(tmp_path), "--init", str(tmp_path), "--out", str(tmp_path / "o")]
    result = CliRunner().invoke(app, [*base, "--tau", "0.05", "--temperature", "0.5"])
    assert result.exit_code == 0, result.output
    assert (seen[0].tau, seen[0].temperature) == (0.05, 0.5)
    result = CliRunner().invoke(app, [*base])
    assert (seen[1].tau, seen[1].temperature) == (1.0, 1.0)  # the defaults
    assert (seen[1].kinds, seen[1].freeze_vision) == ((), False)
    result = CliRunner().invoke(app, [*base, "--tau", "0"])
    assert result.exit_code == 2 and "--tau" in result.output and len(seen) == 2
    result = CliRunner().invoke(app, [*base, "--kind", "detail", "--kind", "visual", "--freeze-vision"])
    assert result.exit_code == 0, result.output
    assert (seen[2].kinds, seen[2].freeze_vision) == (("detail", "visual"), True)
    assert (seen[2].anchor, seen[2].anchor_zoom) == (0.0, "tight")
    result = CliRunner().invoke(app, [*base, "--anchor", "0.5", "--anchor-zoom", "wide", "--anchor-rename",
                                      "--anchor-rephrase", "0.5"])
    assert result.exit_code == 0, result.output
    assert (seen[3].anchor, seen[3].anchor_batch, seen[3].anchor_zoom) == (0.5, 16, "wide")
    assert (seen[3].anchor_rename, seen[3].anchor_rephrase, seen[2].anchor_rename) == (True, 0.5, False)
    for bad in (["--kind", "details"], ["--anchor-zoom", "wider"], ["--anchor", "-1"]):
        result = CliRunner().invoke(app, [*base, *bad])
        assert result.exit_code == 2 and bad[0] in result.output and len(seen) == 4, bad


def test_sft_and_vision_pass_the_zoom_style_and_refuse_an_unknown_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ssr_server.train import sft, vision

    seen: list[Any] = []
    monkeypatch.setattr(sft, "train_sft", lambda cfg: seen.append(cfg) or {})
    monkeypatch.setattr(vision, "train_vision", lambda cfg: seen.append(cfg) or {})
    monkeypatch.setattr("ssr_server.cli.train._report_training", lambda figures, out: None)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    sft_args = ["train", "sft", "--world", str(tmp_path), "--out", str(tmp_path / "o")]
    vision_args = ["train", "vision", "--init", str(tmp_path / "m"), "--out", str(tmp_path / "o")]
    for args in (sft_args, vision_args):
        result = CliRunner().invoke(app, [*args, "--zoom", "strip"])
        assert result.exit_code == 0, result.output
        assert seen.pop().zoom == "strip"
        CliRunner().invoke(app, args)
        default = seen.pop()
        assert default.zoom == "tight" and default.zoom_jitter == 0.0
        CliRunner().invoke(app, [*args, "--zoom", "wide", "--zoom-jitter", "1.2", "--zoom-edge-jitter",
                                 "0.1"])
        passed = seen.pop()
        assert passed.zoom_jitter == 1.2 and passed.zoom_edge_jitter == 0.1
        assert default.zoom_edge_jitter == 0.0
        result = CliRunner().invoke(app, [*args, "--zoom-jitter", "-1"])
        assert result.exit_code == 2 and "--zoom-jitter" in result.output and not seen
        if args is sft_args:
            assert default.zoom_sign is False and default.zoom_count is False
            CliRunner().invoke(app, [*args, "--zoom-sign", "--zoom-count"])
            chosen = seen.pop()
            assert chosen.zoom_sign is True and chosen.zoom_count is True
        if args is vision_args:
            CliRunner().invoke(app, [*args, "--max-pixels", "131072"])
            assert seen.pop().max_pixels == 131072
        result = CliRunner().invoke(app, [*args, "--zoom", "huge"])
        assert result.exit_code == 2 and "--zoom" in result.output and not seen


def test_sft_passes_the_sign_zoom_the_count_search_and_the_grown_layers_and_refuses_bad_values(
        tmp_path: Path, sft_configs: list[Any]) -> None:
    seen = sft_configs
    base = ["train", "sft", "--world", str(tmp_path), "--out", str(tmp_path / "o"), "--zoom-sign"]
    result = CliRunner().invoke(app, [*base, "--zoom-sign-on", "char", "--grow-layers", "2",
                                      "--search-count"])
    assert result.exit_code == 0, result.output
    assert (seen[0].zoom_sign, seen[0].zoom_sign_on, seen[0].grow_layers) == (True, ("char",), 2)
    assert (seen[0].search_count, seen[0].zoom_count) == (True, False)
    CliRunner().invoke(app, base)
    assert (seen[1].zoom_sign_on, seen[1].grow_layers, seen[1].search_count) == (("shape", "char"), 0, False)
    for bad in (["--zoom-sign-on", "colour"], ["--zoom-sign-on", ""], ["--zoom-sign-on", "char,count"],
                ["--grow-layers", "-1"], ["--search-count", "--zoom-count"]):
        result = CliRunner().invoke(app, [*base, *bad])
        assert result.exit_code == 2 and bad[0] in result.output and len(seen) == 2, bad


def test_sft_passes_the_towers_learning_rate_share_and_refuses_it_with_a_frozen_tower(
        tmp_path: Path, sft_configs: list[Any]) -> None:
    seen = sft_configs
    base = ["train", "sft", "--world", str(tmp_path), "--out", str(tmp_path / "o")]
    result = CliRunner().invoke(app, [*base, "--vision-lr-scale", "0.2"])
    assert result.exit_code == 0, result.output
    CliRunner().invoke(app, base)
    assert [cfg.vision_lr_scale for cfg in seen] == [0.2, 1.0]
    for bad in (["--vision-lr-scale", "0.2", "--freeze-vision"], ["--vision-lr-scale", "0"],
                ["--vision-lr-scale", "1.5"]):
        result = CliRunner().invoke(app, [*base, *bad])
        assert result.exit_code == 2 and "--vision-lr-scale" in result.output and len(seen) == 2, bad

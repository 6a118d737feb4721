"""``train soup``: the weighted average of models' weights, refusals, the card's commands, the CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from ssr_lab.cli import app
from ssr_lab.train.soup import SoupError, soup, soup_weights


def _shifted_copy(src: Path, dst: Path, shift: float, commands: list[str]) -> Path:
    """``src`` with every float weight moved by ``shift`` and a made-up command chain."""
    shutil.copytree(src, dst)
    state = load_file(str(src / "model.safetensors"))
    save_file({k: v + shift for k, v in state.items()}, str(dst / "model.safetensors"),
              metadata={"format": "pt"})
    (dst / "ssr_tiny.json").write_text(json.dumps({"commands": commands}))
    return dst


@pytest.fixture
def parents(tiny_model_dir: Path, tmp_path: Path) -> tuple[Path, Path]:
    a = _shifted_copy(tiny_model_dir, tmp_path / "A", 0.0, ["ssr-lab world build W", "ssr-lab train a"])
    b = _shifted_copy(tiny_model_dir, tmp_path / "B", 1.0,
                      ["ssr-lab world build W", "ssr-lab train a", "ssr-lab train b"])
    return a, b


def test_weights_are_normalised_and_bad_ones_refused() -> None:
    assert soup_weights(None, 2) == [0.5, 0.5]
    assert soup_weights([1, 3], 2) == [0.25, 0.75]
    for bad, n in (([1.0], 2), ([1, -1], 2), ([0, 0], 2), (None, 1)):
        with pytest.raises(SoupError):
            soup_weights(bad, n)


def test_the_soup_is_the_weighted_average_and_loads(parents: tuple[Path, Path], tmp_path: Path) -> None:
    from ssr_lab.train.setup import load_model

    a, b = parents
    figures = soup([a, b], tmp_path / "S", [1, 3])
    assert figures["weights"] == [0.25, 0.75]
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    ws = load_file(str(tmp_path / "S" / "model.safetensors"))
    assert set(ws) == set(wa)
    for k in wa:
        assert torch.allclose(ws[k], 0.25 * wa[k] + 0.75 * wb[k], atol=1e-6), k
    assert not torch.equal(ws[next(iter(wa))], wa[next(iter(wa))])
    model, _ = load_model(tmp_path / "S")  # the Hugging Face layout: transformers reads it
    assert sum(p.numel() for p in model.parameters()) > 0
    made = json.loads((tmp_path / "S" / "ssr_tiny.json").read_text())
    # each lineage's commands once, in order, then the soup's own command
    assert made["commands"][:3] == ["ssr-lab world build W", "ssr-lab train a", "ssr-lab train b"]
    assert len(made["commands"]) == 4
    assert "ssr-lab train b" in (tmp_path / "S" / "README.md").read_text()


def test_models_of_other_architectures_or_weights_are_refused(parents: tuple[Path, Path],
                                                              tmp_path: Path) -> None:
    a, b = parents
    config = json.loads((b / "config.json").read_text())
    config["text_config"]["num_hidden_layers"] += 1
    (b / "config.json").write_text(json.dumps(config))
    with pytest.raises(SoupError, match=r"config\.json"):
        soup([a, b], tmp_path / "S")
    shutil.copyfile(a / "config.json", b / "config.json")
    state = load_file(str(b / "model.safetensors"))
    state.pop(next(iter(state)))
    save_file(state, str(b / "model.safetensors"))
    with pytest.raises(SoupError, match="weight names"):
        soup([a, b], tmp_path / "S")
    with pytest.raises(SoupError, match="new folder"):
        soup([a, a], a)
    with pytest.raises(SoupError, match="not a model folder"):
        soup([a, tmp_path], tmp_path / "S")


def test_soup_command(parents: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = parents
    out = tmp_path / "S"
    r = CliRunner().invoke(app, ["train", "soup", str(a), str(b), "--out", str(out), "--weights", "3,1"])
    assert r.exit_code == 0, r.output
    assert json.loads((out / "ssr_tiny.json").read_text())["weights"] == [0.75, 0.25]
    for bad in (["--weights", "x,y"], ["--weights", "1"]):
        r = CliRunner().invoke(app, ["train", "soup", str(a), str(b), "--out", str(tmp_path / "T"), *bad])
        assert r.exit_code == 2 and "weights" in r.output.lower()
        assert not (tmp_path / "T").exists()

"""``train probe``: teacher-forced reading of fresh pictures, own vs another drill's picture."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from ssr_lab.cli import app


@pytest.fixture(scope="module")
def trained(world_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ssr_lab.train import sft

    out = tmp_path_factory.mktemp("probe") / "model"
    sft.train_sft(sft.SFTConfig(world=world_dir, out=out, init="64x1", steps=1, batch_size=2, limit=24,
                                warmup=1, threads=1, cache_examples=False), progress=False)
    return out


def test_probe_reads_each_kind_with_own_and_rotated_pictures(world_dir: Path, trained: Path) -> None:
    from ssr_lab.train.reading_probe import ProbeConfig, format_probe, run_probe

    r = run_probe(ProbeConfig(world=world_dir, model=str(trained), split="train", drills=12, batch_size=5,
                              threads=1))
    assert r["drills"] == 12 and set(r["kinds"]) <= {"visual", "detail"} and r["kinds"]
    assert sum(row["drills"] for row in r["kinds"].values()) == 12
    for row in r["kinds"].values():
        for name in ("own", "rotated"):
            assert 0.0 <= row[name]["exact"] <= 1.0 and row[name]["cross_entropy"] > 0
        # same text, other pictures: the model's view of the picture changed the loss
        assert row["own"]["cross_entropy"] != row["rotated"]["cross_entropy"]
    text = format_probe(r)
    assert "rotated" in text and all(kind in text for kind in r["kinds"])


def test_probe_in_the_strip_style_drills_detail_with_strips(world_dir: Path, trained: Path) -> None:
    from ssr_lab.train.reading_probe import ProbeConfig, run_probe

    rows = [run_probe(ProbeConfig(world=world_dir, model=str(trained), split="train", drills=12, batch_size=6,
                                  threads=1, zoom=zoom))["kinds"] for zoom in ("tight", "strip")]
    assert all("detail" in r for r in rows)
    # the same drills but for the box and crop: a detail drill's loss changes, a visual one's does not
    assert rows[0]["detail"]["own"]["cross_entropy"] != rows[1]["detail"]["own"]["cross_entropy"]
    if "visual" in rows[0]:
        assert rows[0]["visual"]["own"] == rows[1]["visual"]["own"]


def test_probe_command_refuses_what_is_not_a_world(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["train", "probe", "--world", str(tmp_path)])
    assert result.exit_code == 2 and "not a built world" in result.output
    result = CliRunner().invoke(app, ["train", "probe", "--world", str(tmp_path), "--split", "nope"])
    assert result.exit_code == 2 and "split" in result.output

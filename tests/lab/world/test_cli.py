"""``ssr-lab world build``."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from ssr_lab.cli import app


def test_world_build_command(tmp_path: Path) -> None:
    out = tmp_path / "w"
    result = CliRunner().invoke(app, ["world", "build", str(out), "--entities", "20", "--seed", "4",
                                      "--processes", "1"])
    assert result.exit_code == 0, result.output
    assert "built in" in result.output and "image search on" in result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["entities"] == 20 and manifest["seed"] == 4
    assert (out / "corpus.jsonl").is_file() and (out / "images" / "index.json").is_file()


def test_world_build_rejects_bad_arguments(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["world", "build", str(tmp_path / "w"), "--entities", "0"])
    assert result.exit_code == 2 and "entities" in result.output

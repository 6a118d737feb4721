"""``ssr-server infer``: the reference harness's batch workflow, in process and against a server."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ssr_server.cli import app
from ssr_server.tools.demo import demo_picture, shipped_demo_world

runner = CliRunner()


def flat(output: str) -> str:
    """Typer's error box, unwrapped: its borders and line breaks removed."""
    return "".join(output.replace("│", " ").split())


@pytest.fixture()
def examples(tmp_path: Path) -> Path:
    folder = tmp_path / "inputs"
    (folder / "img").mkdir(parents=True)
    for i, entity_id in enumerate(shipped_demo_world().entity_ids()[:2]):
        demo_picture(entity_id).save(folder / "img" / f"{i}.png")
    rows = [{"id": "a", "image": "img/0.png", "question": "What is this landmark?"},
            {"image": "img/1.png", "question": "How tall is it?"}]
    (folder / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    return folder / "rows.jsonl"


def _env(tiny_model_dir: Path, tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "SSR_MODEL": str(tiny_model_dir), "SSR_CACHE_DIR": str(tmp_path / "cache"),
            "SSR_TORCH_THREADS": "1"}


def test_infer_in_process_writes_every_trajectory(examples: Path, tmp_path: Path,
                                                  tiny_model_dir: Path) -> None:
    out = tmp_path / "out"
    args = ["infer", "--input-jsonl", str(examples), "--output", str(out), "--num-samples", "2",
            "--tau", "1.0", "--max-turns", "3", "--profiling"]
    r = runner.invoke(app, args, env=_env(tiny_model_dir, tmp_path))
    assert r.exit_code == 0, r.output
    assert "reasoning per turn: mean" in r.output
    settings = json.loads((out / "settings.json").read_text())
    assert settings["candidates"][0]["id"] == "r_GENERAL_KNOW"
    system = (out / "system_prompt.txt").read_text()
    assert system.startswith("You reason step-by-step using one of the following 6 reasoning strategies.")
    folders = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert folders == ["example_0001_sample_001", "example_0001_sample_002", "example_0002_sample_001",
                       "example_0002_sample_002"]
    seeds = set()
    runs: list[dict[str, Any]] = []
    for name in folders:
        traj = json.loads((out / name / "trajectory.json").read_text())
        run = traj["run"]
        runs.append(run)
        seeds.add(traj["seed"])
        assert traj["context_text"].startswith("<|im_start|>system\n" + system)
        lines = (out / name / "turns.jsonl").read_text().splitlines()
        assert [json.loads(x) for x in lines] == run["turns"]
        prof = json.loads((out / name / "profiling.json").read_text())
        assert prof["turns"] == len(run["turns"]) and prof["outcome"] == run["outcome"]
    assert seeds == {42, 43, 44, 45}  # seed + row * num_samples + sample
    profile = json.loads((out / "profiling.json").read_text())
    summary = profile["summary"]
    assert summary["trajectories"] == 4 and summary["failed"] == 0
    assert summary["turns"] == sum(len(run["turns"]) for run in runs)
    assert summary["reasoning_s"]["n"] == summary["turns"]
    assert sum(summary["outcomes"].values()) == 4
    # the output folder must be new or empty
    again = runner.invoke(app, ["infer", "--input-jsonl", str(examples), "--output", str(out)],
                          env=_env(tiny_model_dir, tmp_path))
    assert again.exit_code == 2 and "neworempty" in flat(again.output)


def test_infer_against_a_server(examples: Path, tmp_path: Path, server_url: str) -> None:
    out = tmp_path / "remote"
    r = runner.invoke(app, ["infer", "--input-jsonl", str(examples), "--output", str(out), "--server",
                            server_url,
                            "--concurrency", "2", "--max-turns", "2"])
    assert r.exit_code == 0, r.output
    for name in ("example_0001_sample_001", "example_0002_sample_001"):
        traj = json.loads((out / name / "trajectory.json").read_text())
        assert traj["status"] == traj["run"]["outcome"] and traj["run"]["turns"]


@pytest.mark.parametrize(("content", "fragment"), [
    ("{oops\n", ":1: not valid JSON"),
    ('{"image": "img/0.png"}\n', "needs a non-empty 'question'"),
    ('{"image": "missing.png", "question": "Q?"}\n', "image not found"),
    ("\n", "no examples"),
])
def test_bad_input_lines_are_named(tmp_path: Path, content: str, fragment: str) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(content)
    r = runner.invoke(app, ["infer", "--input-jsonl", str(path), "--output", str(tmp_path / "o")])
    assert r.exit_code == 2 and "".join(fragment.split()) in flat(r.output), r.output

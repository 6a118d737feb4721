"""``ssr-server runs export``: stored runs written as the trajectory records ``ssr-server infer`` writes,
filtered, images inline; runs in flight left out."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx
from typer.testing import CliRunner

from ssr_server.batch.infer import trajectory_totals
from ssr_server.cli import app


def test_export_writes_finished_runs_as_trajectories(stored: Any, sqlite_url: str, tmp_path: Path,
                                                     demo_png_b64: str, kit: Any) -> None:
    runs = []
    with stored(sqlite_url) as url:
        for body in ({"question": "What is this?", "images": [demo_png_b64], "max_turns": 2, "seed": 0},
                     {"question": "Who?", "mode": "freeform", "max_turns": 1, "reasoning_budget": 4}):
            runs.append(httpx.post(f"{url}/v1/agent/runs", json=body, timeout=120).json())
        stored_runs = {r["id"]: kit.get_run(url, r["id"]) for r in runs}
        image = httpx.get(url + stored_runs[runs[0]["id"]]["images"][0]["url"], timeout=30).content
    out = tmp_path / "runs.jsonl"
    result = CliRunner().invoke(app, ["runs", "export", "--out", str(out), "--store", sqlite_url])
    assert result.exit_code == 0, result.output
    assert "2 runs written" in result.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [rec["input"]["id"] for rec in lines] == [runs[1]["id"], runs[0]["id"]]  # newest first
    for rec in lines:
        answered = next(r for r in runs if r["id"] == rec["input"]["id"])
        assert rec["status"] == answered["outcome"] == rec["run"]["outcome"]
        assert rec["run"]["turns"] == answered["turns"] and rec["input"]["question"] == answered["question"]
        totals = trajectory_totals(rec["run"])  # what infer computes from its own records
        assert totals["turns"] == len(answered["turns"]) and totals["outcome"] == answered["outcome"]
    first = lines[1]
    assert first["seed"] == 0 and len(first["input"]["images"]) == 1
    head, data = first["input"]["images"][0].split(",", 1)
    assert head.startswith("data:image/") and base64.b64decode(data) == image
    # filtered: only the freeform run
    result = CliRunner().invoke(app, ["runs", "export", "--out", str(out), "--store", sqlite_url,
                                      "--mode", "freeform", "--no-images"])
    assert result.exit_code == 0, result.output
    only = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["input"]["id"] for r in only] == [runs[1]["id"]] and only[0]["input"]["images"] == []
    bad = CliRunner().invoke(app, ["runs", "export", "--out", str(out), "--store", sqlite_url,
                                   "--since", "yesterday"])
    assert bad.exit_code != 0 and "not a date" in bad.output

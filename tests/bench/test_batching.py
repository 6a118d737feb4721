"""``bench batching``: one forward of N runs' decode steps or selections, timed per N; figures printed,
never asserted against a time (no wall-clock tests)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from typer.testing import CliRunner

from ssr_server.bench.batching import format_batching, run_batching_bench
from ssr_server.cli import app
from ssr_server.engine.torch.engine import TorchEngine


def test_batching_bench_times_each_level_on_distinct_contexts(tiny_model_dir: Path, tmp_path: Path) -> None:
    engine = TorchEngine(str(tiny_model_dir), start=False)
    try:
        r = run_batching_bench(engine, levels=(2, 1), past_tokens=120, repeats=1,
                               json_path=str(tmp_path / "b.json"))
    finally:
        asyncio.run(engine.close())
    assert [row["runs"] for row in r["levels"]] == [1, 2]
    assert len(r["past_tokens"]) == 2 and min(r["past_tokens"]) >= 120
    assert len(r["candidate_tokens"]) == 6  # the default library, as the agent scores it
    one, two = r["levels"]
    assert one["decode_sharing"] == 1.0 and one["selection_sharing"] == 1.0
    assert all(row["decode_ms"] > 0 and row["selection_ms"] > 0 for row in r["levels"])
    assert two["selection_sharing"] == 2 * one["selection_ms"] / two["selection_ms"]
    assert json.loads((tmp_path / "b.json").read_text())["levels"] == r["levels"]
    assert "sharing" in format_batching(r)
    # the runs' contexts are distinct cache entries: no run shares another's past
    assert len(engine.prefix_cache) >= 2


def test_batching_command_prints_the_table(tiny_model_dir: Path) -> None:
    result = CliRunner().invoke(app, ["bench", "batching", "--model", str(tiny_model_dir), "--concurrency",
                                      "1", "--past-tokens", "64", "--repeats", "1"])
    assert result.exit_code == 0, result.output
    assert "selection ms" in result.output and "decode ms" in result.output

"""``bench logprobs``: the head's log-probabilities whole vs blockwise, side by side; figures printed,
never asserted against a time."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from ssr_server.bench.logprobs import format_logprobs, run_logprobs_bench
from ssr_server.cli import app
from ssr_server.engine.torch.config import EngineConfig
from ssr_server.engine.torch.loader import load_model


def test_both_ways_agree_and_the_blockwise_one_holds_less(tiny_model_dir: Path, tmp_path: Path) -> None:
    lm = load_model(str(tiny_model_dir), EngineConfig())
    r = run_logprobs_bench(lm, rows=40, repeats=2, json_path=str(tmp_path / "l.json"))
    assert r["rows"] == 40 and r["vocab"] == int(lm.lm_head.weight.shape[0])
    assert r["whole_ms"] > 0 and r["blockwise_ms"] > 0
    assert r["blockwise_over_whole"] == r["blockwise_ms"] / r["whole_ms"]
    assert r["max_abs_diff"] < 1e-4  # fp32
    assert r["blockwise_largest_bytes"] < r["whole_largest_bytes"]
    assert json.loads((tmp_path / "l.json").read_text()) == r
    text = format_logprobs(r)
    assert "blockwise / whole" in text and "40 rows" in text


def test_logprobs_command_prints_the_figures(tiny_model_dir: Path) -> None:
    result = CliRunner().invoke(app, ["bench", "logprobs", "--model", str(tiny_model_dir), "--rows", "16",
                                      "--repeats", "1"])
    assert result.exit_code == 0, result.output
    assert "whole (log-softmax of the logits)" in result.output and "max abs diff" in result.output
    bad = CliRunner().invoke(app, ["bench", "logprobs", "--model", str(tiny_model_dir), "--rows", "0"])
    assert bad.exit_code == 2

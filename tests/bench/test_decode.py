"""``bench decode``: ms per token beside the bandwidth limit, and tool calls with drafts off and on;
figures printed, never asserted against a time."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from ssr_server.cli import app


def test_decode_bench_reports_the_limit_and_tool_call_forwards(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "decode.json"
    result = CliRunner().invoke(app, ["bench", "decode", "--model", str(tiny_model_dir), "--dtype", "fp32",
                                      "--new-tokens", "4", "--repeats", "1", "--json", str(out)])
    assert result.exit_code == 0, result.output
    r = json.loads(out.read_text())
    assert r["limit_ms"] > 0 and r["rows"] and all(row["forward_ms"] > 0 for row in r["rows"])
    t = r["tool_calls"]
    assert t["calls"] == 6 and t["same_text"] is True
    assert t["forwards_on"] < t["forwards_off"] <= t["tokens"]
    assert "tool calls (6 x get_weather, same text: True)" in result.output

"""``bench actions``: the split's questions with drafts off and on through the real agent loop; the text
of every turn is compared, forwards counted, times broken down; figures printed, never asserted against a
time."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from ssr_server.cli import app


def test_actions_bench_compares_drafts_off_and_on(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "actions.json"
    result = CliRunner().invoke(app, ["bench", "actions", "--model", str(tiny_model_dir), "--limit", "3",
                                      "--concurrency", "2", "--mode", "ssr", "--mode", "freeform",
                                      "--json", str(out)])
    assert result.exit_code == 0, result.output
    r = json.loads(out.read_text())
    assert r["questions"] == 3 and r["split"] == "test"
    for mode in ("ssr", "freeform"):
        p = r["modes"][mode]
        off, on = p["off"], p["on"]
        assert off["questions"] == on["questions"] == 3 and off["failed"] == on["failed"] == 0
        assert p["identical_turns"]["of"] > 0
        assert p["identical_turns"]["same"] == p["identical_turns"]["of"]  # drafts never change the text
        assert off["tokens_per_action"] == on["tokens_per_action"]
        assert on["forwards_per_action"] < off["forwards_per_action"]
        assert off["draft_acceptance"] is None and on["draft_acceptance"] > 0
        parts = on["action_breakdown_ms"]
        assert set(parts) == {"queue", "prefill", "forward", "grammar", "sample", "draft", "detok", "other"}
        assert parts["forward"] > 0 and parts["draft"] > 0 and off["action_breakdown_ms"]["draft"] == 0
    assert "reasoning" in r["modes"]["freeform"]["on"]["by_kind"]
    assert r["ssr_over_freeform_model_time"] > 0
    assert "decode forwards per action" in result.output and "identical turns" in result.output

    bad = CliRunner().invoke(app, ["bench", "actions", "--model", str(tiny_model_dir), "--split", "nope"])
    assert bad.exit_code == 2 and "no 'nope' questions" in bad.output

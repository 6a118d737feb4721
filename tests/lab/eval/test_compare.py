"""``eval.compare`` and ``ssr-lab compare``: intervals and the paired test, against hand values."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from ssr_lab.cli import app
from ssr_lab.eval.compare import compare, mcnemar_exact, paired_bootstrap, wilson
from ssr_lab.eval.report import format_summary, summarize


def test_wilson_matches_the_closed_form_by_hand() -> None:
    # 8 of 10, z = 1.96: centre (0.8 + 0.19208) / 1.38416, half 1.96 sqrt(0.016 + 0.009604) / 1.38416
    low, high = wilson(8, 10, z=1.96)
    centre, half = 0.99208 / 1.38416, 1.96 * math.sqrt(0.016 + 0.009604) / 1.38416
    assert low == pytest.approx(centre - half, abs=1e-12) and high == pytest.approx(centre + half, abs=1e-12)
    assert (round(low, 4), round(high, 4)) == (0.4902, 0.9433)
    assert wilson(0, 20)[0] == 0.0 and wilson(20, 20)[1] == 1.0 and wilson(0, 0) == (0.0, 1.0)
    wide, narrow = wilson(30, 40), wilson(300, 400)
    assert narrow[1] - narrow[0] < wide[1] - wide[0]


def test_mcnemar_is_the_two_sided_binomial_tail_of_the_discordant_pairs() -> None:
    assert mcnemar_exact(8, 2) == pytest.approx(2 * (1 + 10 + 45) / 1024)  # 0.109375
    assert mcnemar_exact(2, 8) == mcnemar_exact(8, 2)
    assert mcnemar_exact(0, 0) == 1.0 and mcnemar_exact(5, 5) == 1.0
    assert mcnemar_exact(0, 10) == pytest.approx(2 / 1024)


def test_paired_bootstrap_agrees_with_resampling_questions() -> None:
    # The multinomial shortcut against the literal procedure: resample n question indices, average.
    only_a, only_b, n = 7, 15, 120
    deltas = np.array([1] * only_b + [-1] * only_a + [0] * (n - only_a - only_b))
    rng = np.random.default_rng(1)
    literal = np.quantile(deltas[rng.integers(0, n, size=(20_000, n))].mean(axis=1), [0.025, 0.975])
    low, high = paired_bootstrap(only_a, only_b, n, samples=20_000)
    assert low == pytest.approx(literal[0], abs=0.01) and high == pytest.approx(literal[1], abs=0.01)
    assert low < (only_b - only_a) / n < high
    assert paired_bootstrap(only_a, only_b, n) == paired_bootstrap(only_a, only_b, n)  # seeded


def _eval(correct: dict[str, bool], kinds: dict[str, str], model: str) -> dict[str, Any]:
    records = [{"id": q, "kind": kinds[q], "correct": c, "heldout": q.endswith("h")}
               for q, c in correct.items()]
    return {"settings": {"model": model, "mode": "ssr", "split": "test"}, "records": records}


def test_compare_pairs_by_question_and_counts_discordant_pairs() -> None:
    kinds = {"q1": "search", "q2": "search", "q3": "visual", "q4h": "visual", "q5": "visual", "q6": "search"}
    a = _eval({"q1": True, "q2": True, "q3": False, "q4h": True, "q5": False, "q6": True}, kinds, "A")
    # B lacks q6 and lists its records in another order
    b = _eval({"q5": True, "q4h": False, "q3": True, "q2": True, "q1": False}, kinds, "B")
    result = compare(a, b)
    assert result["shared"] == 5 and result["a"]["questions"] == 6 and result["b"]["model"] == "B"
    groups = {g["group"]: g for g in result["groups"]}
    assert [g["group"] for g in result["groups"]] == ["search", "visual", "overall", "seen", "held-out"]
    overall = groups["overall"]
    assert (overall["both"], overall["only_a"], overall["only_b"], overall["neither"]) == (1, 2, 2, 0)
    assert overall["success_a"] == pytest.approx(3 / 5) and overall["diff"] == pytest.approx(0.0)
    assert overall["mcnemar_p"] == pytest.approx(1.0)
    visual = groups["visual"]
    assert (visual["only_a"], visual["only_b"], visual["questions"]) == (1, 2, 3)
    assert visual["diff"] == pytest.approx(1 / 3)
    assert groups["held-out"]["questions"] == 1 and groups["held-out"]["only_a"] == 1


def test_compare_refuses_evals_with_no_question_in_common() -> None:
    from ssr_server.core.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="share no question"):
        compare(_eval({"q1": True}, {"q1": "search"}, "A"), _eval({"q2": True}, {"q2": "search"}, "B"))


def test_compare_command_prints_and_writes_the_comparison(tmp_path: Path) -> None:
    kinds = {f"q{i}": "named" for i in range(30)}
    a = _eval({q: i < 15 for i, q in enumerate(kinds)}, kinds, "base")
    b = _eval({q: i < 25 for i, q in enumerate(kinds)}, kinds, "new")  # B right on 10 more, never worse
    pa, pb, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "cmp.json"
    pa.write_text(json.dumps(a)), pb.write_text(json.dumps(b))
    r = CliRunner().invoke(app, ["compare", str(pa), str(pb), "--json", str(out)])
    assert r.exit_code == 0, r.output
    saved = json.loads(out.read_text())
    overall = next(g for g in saved["groups"] if g["group"] == "overall")
    assert overall["only_b"] == 10 and overall["only_a"] == 0
    assert overall["mcnemar_p"] == pytest.approx(2 / 1024) and overall["diff_ci95"][0] > 0
    assert "overall" in r.output and "+33.3" in r.output and "0.002" in r.output

    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    r = CliRunner().invoke(app, ["compare", str(pa), str(bad)])
    assert r.exit_code == 2 and "not an eval JSON" in r.output


def test_eval_summary_carries_the_wilson_interval_and_the_kinds_mean() -> None:
    records = [{"id": f"q{i}", "kind": "search" if i < 10 else "visual", "correct": i < 8 or i == 10,
                "outcome": "answered", "turns": 1, "move_correct": [], "action_correct": [], "consistent": [],
                "chosen": [], "reasoning_s": [],
                "action_s": [], "model_s": 0.1, "generated_tokens": 3} for i in range(14)]
    summary = summarize(records)  # search 8 of 10 right, visual 1 of 4
    assert summary["kinds"]["search"]["success_ci95"] == list(wilson(8, 10))
    assert summary["overall"]["success_ci95"] == list(wilson(9, 14))
    assert summary["kind_balanced_success"] == pytest.approx((0.8 + 0.25) / 2)
    text = format_summary(summary)
    low, high = wilson(9, 14)
    assert f"95% interval {100 * low:.1f}% - {100 * high:.1f}%" in text and "the kinds' mean 52.5%" in text

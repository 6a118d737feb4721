"""``ssr-lab eval``: the random tiny model end to end; the summary is a recount of the records."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ssr_lab.cli import app
from ssr_lab.eval.report import format_summary, make_record, summarize
from ssr_lab.eval.runner import select_questions
from ssr_lab.world import load_questions


@pytest.mark.parametrize("mode", ["ssr", "freeform"])
def test_eval_of_the_random_tiny_model_runs_end_to_end(world_dir: Path, tmp_path: Path, tiny_model_dir: Path,
                                                       mode: str) -> None:
    out = tmp_path / "eval.json"
    r = CliRunner().invoke(app, ["eval", "--world", str(world_dir), "--json", str(out), "--mode", mode,
                                 "--split", "test", "--limit", "8", "--concurrency", "2", "--max-turns", "3",
                                 "--reasoning-budget", "16"],
                           env={**os.environ, "SSR_MODEL": str(tiny_model_dir), "SSR_TORCH_THREADS": "1"})
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    records = data["records"]
    assert len(records) == 8 and data["settings"]["questions"] == 8
    assert [rec["id"] for rec in records] == [q.id for q in select_questions(world_dir, "test", 8)]
    assert data["summary"] == summarize(records)  # the summary is a recount of the records
    for rec in records:
        assert rec["outcome"] in {"answered", "max_turns", "error", "context_limit"}
        assert 1 <= rec["turns"] <= 3 and len(rec["actions"]) == rec["turns"]
        if mode == "ssr":
            assert len(rec["move_correct"]) == rec["turns"] and all(rec["consistent"])
        else:
            assert rec["chosen"] == [None] * rec["turns"] and rec["move_correct"] == []
    assert "overall" in r.output and "success" in r.output


def test_eval_passes_the_selection_settings_and_refuses_bad_ones(world_dir: Path, tmp_path: Path,
                                                                  tiny_model_dir: Path) -> None:
    env = {**os.environ, "SSR_MODEL": str(tiny_model_dir), "SSR_TORCH_THREADS": "1"}
    chosen = {}
    for alpha in ("0", "4"):
        out = tmp_path / f"alpha{alpha}.json"
        r = CliRunner().invoke(app, ["eval", "--world", str(world_dir), "--json", str(out), "--split", "test",
                                     "--limit", "8", "--max-turns", "2", "--alpha", alpha], env=env)
        assert r.exit_code == 0, r.output
        data = json.loads(out.read_text())
        assert data["settings"]["alpha"] == float(alpha) and data["settings"]["tau"] == 0.0
        chosen[alpha] = [rec["chosen"] for rec in data["records"]]
    # the random model's candidates differ in length, so the length normalisation changes its choices
    assert chosen["0"] != chosen["4"]
    for bad in (["--alpha", "-1"], ["--tau", "1000"]):
        r = CliRunner().invoke(app, ["eval", "--world", str(world_dir), "--json", str(tmp_path / "x.json"),
                                     "--limit", "2", *bad], env=env)
        assert r.exit_code == 2 and "alpha" in r.output
        assert not (tmp_path / "x.json").exists()


def test_summary_by_hand() -> None:
    def rec(kind: str, correct: bool, chosen: list[str | None], gold: list[str], **kw: Any) -> dict[str, Any]:
        actions = kw.pop("actions", ["answer"] * len(chosen))
        return {"kind": kind, "correct": correct, "outcome": "answered" if correct else "max_turns",
                "turns": len(chosen), "chosen": chosen, "actions": actions,
                "move_correct": [i < len(gold) and c == gold[i] for i, c in enumerate(chosen)],
                "action_correct": [True] * len(chosen), "consistent": [True] * len(chosen),
                "reasoning_s": [0.01] * len(chosen), "action_s": [0.02] * len(chosen),
                "model_s": 0.03 * len(chosen), "generated_tokens": 5 * len(chosen), **kw}

    records = [rec("visual", True, ["a"], ["a"]), rec("visual", False, ["b", "b"], ["a"]),
               rec("search", True, ["s", "l", "e"], ["s", "l", "e"])]
    s = summarize(records)
    assert list(s["kinds"]) == ["search", "visual"]
    assert s["overall"]["success"] == pytest.approx(2 / 3)
    assert s["kinds"]["visual"]["move_accuracy"] == pytest.approx(1 / 3)  # a; b, b vs a: 1 of 3 turns
    assert s["overall"]["move_accuracy"] == pytest.approx(4 / 6)
    assert s["overall"]["turns_mean"] == pytest.approx(2.0)
    assert s["overall"]["candidate_mix"] == {"a": 1, "b": 2, "e": 1, "l": 1, "s": 1}
    assert s["overall"]["reasoning_s"]["mean"] == pytest.approx(0.01)
    assert s["overall"]["model_s"]["mean"] == pytest.approx(0.06)
    assert s["overall"]["generated_tokens_mean"] == pytest.approx(10.0)
    assert "phrasing" not in s  # records written before the held-out flag
    flagged = [{**r, "heldout": i == 1} for i, r in enumerate(records)]
    s = summarize(flagged)
    assert s["phrasing"]["seen"]["questions"] == 2 and s["phrasing"]["seen"]["success"] == 1.0
    assert s["phrasing"]["held-out"]["success"] == 0.0 and s["overall"] == summarize(records)["overall"]
    assert "held-out" in format_summary(s) and "held-out" not in format_summary(summarize(records))
    assert "attributes" not in s and "by attribute" not in format_summary(s)  # records before the attribute


def test_summary_by_attribute_shows_a_collapsed_answer_distribution() -> None:
    base = {"outcome": "answered", "turns": 1, "chosen": ["r"], "actions": ["answer"], "move_correct": [True],
            "action_correct": [True], "consistent": [True], "reasoning_s": [0.01], "action_s": [0.02],
            "model_s": 0.03, "generated_tokens": 2}
    gold_counts = ["2", "3", "4", "5", "4", "6"]
    records = [{**base, "kind": "visual", "attribute": "count", "prediction": "4", "correct": g == "4"}
               for g in gold_counts]
    records += [{**base, "kind": "visual", "attribute": "colour", "prediction": c, "correct": True}
                for c in ("red", "blue", "red")]
    records += [{**base, "kind": "search", "attribute": "height", "prediction": None, "correct": False}]
    s = summarize(records)
    assert list(s["attributes"]) == ["search/height", "visual/colour", "visual/count"]
    count = s["attributes"]["visual/count"]
    assert count["questions"] == 6 and count["success"] == pytest.approx(2 / 6)
    assert count["most_said"] == [["4", 6]]
    assert s["attributes"]["visual/colour"]["most_said"] == [["red", 2], ["blue", 1]]
    assert s["attributes"]["search/height"] == {"questions": 1, "success": 0.0, "most_said": []}
    text = format_summary(s)
    assert "visual by attribute: colour 100.0% of 3 (most said: red x2, blue x1); count 33.3% of 6" in text
    assert "search by attribute" not in text  # text kinds have dozens of attributes: JSON only


def test_records_judge_answers_and_moves(world_dir: Path) -> None:
    q = next(q for q in load_questions(world_dir / "questions.jsonl") if q.kind == "search")
    turn = {"reasoning_s": 0.1, "action_s": 0.2, "reasoning_tokens": 0, "action_tokens": 4,
            "scored_tokens": 60}
    run = {"outcome": "answered", "answer": q.answer.upper() + ".", "error": None, "turns": [
        {**turn, "candidate_id": "r_IDENTIFY_BY_IMAGE", "action_type": "image_search"},
        {**turn, "candidate_id": "r_ANSWER_FROM_IMAGE", "action_type": "answer"}]}
    actions = {"r_IDENTIFY_BY_IMAGE": "image_search", "r_ANSWER_FROM_IMAGE": "answer"}
    r = make_record(q, run, None, actions)
    assert r["correct"]  # normalised match: case and punctuation do not count
    assert r["heldout"] == q.heldout_template
    assert r["move_correct"] == [True, False] and r["action_correct"] == [True, False]
    assert r["consistent"] == [True, True] and r["model_s"] == pytest.approx(0.6)
    failed = make_record(q, None, "HTTP 500", actions)
    assert not failed["correct"] and failed["outcome"] == "failed" and failed["error"] == "HTTP 500"


def test_records_judge_whether_a_zoom_box_is_on_the_plaque(world_dir: Path) -> None:
    q = next(q for q in load_questions(world_dir / "questions.jsonl") if q.kind == "detail")
    gold = q.moves[0].box
    turn = {"reasoning_s": 0.1, "action_s": 0.2, "reasoning_tokens": 0, "action_tokens": 4,
            "scored_tokens": 60, "candidate_id": "r_ZOOM_DETAIL", "action_type": "zoom"}
    beside = [gold[2] + 1, gold[1], min(1000, gold[2] + 100), gold[3]]  # just right of the plaque
    run = {"outcome": "max_turns", "answer": None, "error": None, "turns": [
        {**turn, "arguments": {"bbox_2d": list(gold), "label": "plaque", "img_idx": 0}},
        {**turn, "arguments": {"bbox_2d": beside, "label": "plaque", "img_idx": 0}},
        {**turn, "arguments": {"bbox_2d": "not a box"}},
        {**turn, "candidate_id": "r_ANSWER_FROM_IMAGE", "action_type": "answer", "arguments": {}}]}
    r = make_record(q, run, None, {})
    assert r["zoom_on_target"] == [True, False, False]
    assert r["zoom_boxes"] == [list(gold), beside, "not a box"] and r["gold_box"] == list(gold)
    s = summarize([r])
    assert s["overall"]["zoom_calls"] == 3 and s["overall"]["zoom_on_target"] == pytest.approx(1 / 3)
    assert "33.3% of 3 zoom calls" in format_summary(s)
    search = next(q for q in load_questions(world_dir / "questions.jsonl") if q.kind == "search")
    assert make_record(search, run, None, {})["zoom_on_target"] == []  # no gold box: nothing to judge
    assert make_record(search, run, None, {})["gold_box"] is None


def test_a_zoom_into_a_crop_is_judged_through_that_crop(world_dir: Path) -> None:
    from ssr_lab.world.views import coarse_boxes

    q = next(q for q in load_questions(world_dir / "questions.jsonl") if q.kind == "detail")
    gold = q.moves[0].box
    strip, inner = coarse_boxes(gold)
    cx = (gold[0] + gold[2]) / 2
    turn = {"reasoning_s": 0.1, "action_s": 0.2, "reasoning_tokens": 0, "action_tokens": 4,
            "scored_tokens": 60, "candidate_id": "r_ZOOM_DETAIL", "action_type": "zoom"}

    def call(box: Any, source: int, image: int) -> dict[str, Any]:
        return {**turn, "arguments": {"bbox_2d": list(box), "label": "plaque", "img_idx": source},
                "tool_data": {"box": list(box), "source_image": source, "image": image}}

    # the strip's crop spans the question image's width: its columns are the picture's
    off = [0, 0, 100, 1000] if cx > 200 else [900, 0, 1000, 1000]
    # a crop of the picture's left or right half: the same columns mean other places in the picture
    half = [0, 0, 500, 1000] if cx > 500 else [500, 0, 1000, 1000]
    run = {"outcome": "answered", "answer": "x", "error": None, "turns": [
        call(strip, 0, 1), call(inner, 1, 2), call(off, 1, 3), call(half, 0, 4), call(inner, 4, 5),
        call(gold, 7, 6)]}  # image 7 was never made: a miss
    r = make_record(q, run, None, {})
    assert r["zoom_on_target"] == [True, True, False, False, False, False]
    assert summarize([r])["overall"]["zoom_last_on_target"] == 0.0
    run["turns"] = run["turns"][:2]
    r = make_record(q, run, None, {})
    assert r["zoom_on_target"] == [True, True] and summarize([r])["overall"]["zoom_last_on_target"] == 1.0


def test_limit_covers_every_kind(world_dir: Path) -> None:
    kinds = {q.kind for q in select_questions(world_dir, "test")}
    picked = select_questions(world_dir, "test", limit=len(kinds))
    assert {q.kind for q in picked} == kinds and len(kinds) >= 5
    assert select_questions(world_dir, "test", limit=10**6) == select_questions(world_dir, "test")

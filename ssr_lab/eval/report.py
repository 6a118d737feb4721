"""Eval records (one per question) and the summary recomputed from them, per question kind and overall.

A record keeps what a run did against what the question's gold says: the prediction and whether it is
correct (normalised answer match), the chosen rationales against the gold moves, the action types, and
the latency and token figures. ``summarize`` is a pure function of the records, so the summary in an
eval JSON can always be recomputed (and is, in the tests).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from ssr_lab.eval.compare import wilson
from ssr_lab.world.records import KINDS, MOVE_ACTIONS, Question
from ssr_server.core.actions import allowed_actions, validate_box
from ssr_server.core.answers import is_correct
from ssr_server.core.errors import ToolError
from ssr_server.core.summary import forwards_line, percentiles


def make_record(question: Question, run: dict[str, Any] | None, error: str | None,
                candidate_actions: dict[str, str]) -> dict[str, Any]:
    """The record of one question; ``candidate_actions`` maps the library's ids to their actions."""
    gold = [m.move for m in question.moves]
    gold_box = next((list(m.box) for m in question.moves if m.box), None)
    base = {"id": question.id, "kind": question.kind, "split": question.split, "question": question.question,
            "gold_answer": question.answer, "aliases": list(question.aliases), "gold_moves": gold,
            "heldout": question.heldout_template, "gold_box": gold_box, "attribute": question.attribute}
    if run is None:
        return {**base, "prediction": None, "correct": False, "outcome": "failed", "error": error, "turns": 0,
                "chosen": [], "actions": [], "move_correct": [], "action_correct": [], "consistent": [],
                "reasoning_s": [], "action_s": [], "model_s": 0.0, "generated_tokens": 0, "scored_tokens": 0,
                "zoom_on_target": [], "zoom_boxes": []}
    turns = run["turns"]
    chosen = [t["candidate_id"] for t in turns]
    actions = [t["action_type"] for t in turns]
    gold_actions = [MOVE_ACTIONS[m] for m in gold]
    return {
        **base, "prediction": run["answer"],
        "correct": run["outcome"] == "answered" and is_correct(run["answer"] or "", question.answer,
                                                               question.aliases),
        "outcome": run["outcome"], "error": run.get("error"), "turns": len(turns), "chosen": chosen,
        "actions": actions,
        "move_correct": [i < len(gold) and c == gold[i] for i, c in enumerate(chosen)] if any(chosen) else [],
        "action_correct": [i < len(gold_actions) and a == gold_actions[i] for i, a in enumerate(actions)],
        "consistent": [c is None or c not in candidate_actions or a in allowed_actions(candidate_actions[c])
                       for c, a in zip(chosen, actions, strict=True)],
        "reasoning_s": [t["reasoning_s"] for t in turns], "action_s": [t["action_s"] for t in turns],
        "model_s": sum(t["reasoning_s"] + t["action_s"] for t in turns),
        "generated_tokens": sum(t["reasoning_tokens"] + t["action_tokens"] for t in turns),
        "scored_tokens": sum(t["scored_tokens"] for t in turns),
        "action_tokens": sum(t["action_tokens"] for t in turns),
        "action_forwards": sum(t.get("action_forwards", 0) for t in turns),
        "zoom_on_target": _zoom_on_target(question, turns),
        # as the model wrote them (a box the tool refused included): where its boxes go, not only if they hit
        "zoom_boxes": [(t.get("arguments") or {}).get("bbox_2d") for t in turns
                       if t.get("action_type") == "zoom"],
    }


def _zoom_on_target(question: Question, turns: Sequence[dict[str, Any]]) -> list[bool]:
    """Per zoom call of a question whose gold moves hold a zoom box: does the call's box contain the gold
    box's centre (the plaque)? What a detail question's success rests on before any reading. A call into
    an earlier call's crop (``img_idx`` > 0) is placed in the question image through that crop."""
    gold = next((m.box for m in question.moves if m.box), None)
    if gold is None:
        return []
    cx, cy = (gold[0] + gold[2]) / 2, (gold[1] + gold[3]) / 2
    regions: dict[Any, tuple[float, ...]] = {0: (0, 0, 1000, 1000)}  # image -> its place in the question's
    hits = []
    for t in turns:
        if t.get("action_type") != "zoom":
            continue
        args, data = t.get("arguments") or {}, t.get("tool_data") or {}
        try:  # the zoom tool's own check: a box it refuses is a miss
            box = validate_box(args.get("bbox_2d"))
        except (ToolError, TypeError):
            hits.append(False)
            continue
        parent = regions.get(data.get("source_image", args.get("img_idx", 0)))
        if parent is None:  # a zoom into an image that is no crop of the question's
            hits.append(False)
            continue
        w, h = (parent[2] - parent[0]) / 1000, (parent[3] - parent[1]) / 1000
        x1, y1, x2, y2 = (parent[0] + box[0] * w, parent[1] + box[1] * h,
                          parent[0] + box[2] * w, parent[1] + box[3] * h)
        if "image" in data:
            regions[data["image"]] = (x1, y1, x2, y2)
        hits.append(x1 <= cx <= x2 and y1 <= cy <= y2)
    return hits


def _rate(flags: Iterable[bool]) -> float | None:
    values = list(flags)
    return sum(values) / len(values) if values else None


def _group(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {
        "questions": len(records),
        "success": _rate(r["correct"] for r in records),
        "success_ci95": list(wilson(sum(bool(r["correct"]) for r in records), len(records))),
        "answered": _rate(r["outcome"] == "answered" for r in records),
        "failed": sum(r["outcome"] == "failed" for r in records),
        "turns_mean": _mean(r["turns"] for r in records),
        "move_accuracy": _rate(f for r in records for f in r["move_correct"]),
        "action_accuracy": _rate(f for r in records for f in r["action_correct"]),
        "consistency": _rate(f for r in records for f in r["consistent"]),
        "zoom_calls": sum(len(r.get("zoom_on_target", [])) for r in records),
        "zoom_on_target": _rate(f for r in records for f in r.get("zoom_on_target", [])),
        # per question that zoomed: its last call (what it read from; a coarse-to-fine run zooms twice)
        "zoom_last_on_target": _rate(r["zoom_on_target"][-1] for r in records if r.get("zoom_on_target")),
        "candidate_mix": dict(sorted(Counter(c for r in records for c in r["chosen"] if c).items())),
        "outcomes": dict(sorted(Counter(r["outcome"] for r in records).items())),
        "reasoning_s": percentiles((x for r in records for x in r["reasoning_s"]), (50, 95)),
        "action_s": percentiles((x for r in records for x in r["action_s"]), (50, 95)),
        "model_s": percentiles((r["model_s"] for r in records if r["outcome"] != "failed"), (50, 95)),
        "generated_tokens_mean": _mean(r["generated_tokens"] for r in records if r["outcome"] != "failed"),
        "actions_decoded": sum(1 for r in records for a in r.get("actions", []) if a),
        "action_tokens": sum(r.get("action_tokens", 0) for r in records),
        "action_forwards": sum(r.get("action_forwards", 0) for r in records),
    }


def _mean(values: Iterable[float]) -> float | None:
    v = list(values)
    return sum(v) / len(v) if v else None


def _kind_order(kind: str) -> int:
    return (*KINDS, kind).index(kind)


def summarize(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per kind and overall; with ``phrasing`` (records that say whether their question's phrasing is one
    the training split never uses) also per phrasing: what generalises beyond the training templates."""
    kinds = sorted({r["kind"] for r in records}, key=_kind_order)
    out: dict[str, Any] = {"overall": _group(records),
                           "kinds": {k: _group([r for r in records if r["kind"] == k]) for k in kinds}}
    rates = [g["success"] for g in out["kinds"].values() if g["success"] is not None]
    # The world draws kinds unevenly (visual and detail are 43% of the full test split, two-hop 2.5%):
    # the mean of the kinds' rates is the figure that does not move with that mix or with --limit.
    out["kind_balanced_success"] = sum(rates) / len(rates) if rates else None
    if records and all("attribute" in r for r in records):  # nor the attribute before the sixteenth session
        out["attributes"] = _attributes(records)
    if records and all("heldout" in r for r in records):  # eval JSONs written before it lack the flag
        out["phrasing"] = {name: _group([r for r in records if r["heldout"] == held])
                           for name, held in (("seen", False), ("held-out", True))}
    return out


def _attributes(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Success per kind and asked attribute, with the answers given most often: a model that answers "4"
    to every count question shows here as a collapsed answer distribution, not only as a low rate."""
    keys = sorted({(r["kind"], r["attribute"]) for r in records}, key=lambda ka: (_kind_order(ka[0]), ka[1]))
    out: dict[str, Any] = {}
    for kind, attribute in keys:
        group = [r for r in records if r["kind"] == kind and r["attribute"] == attribute]
        said = Counter(str(r["prediction"]) for r in group if r["prediction"] is not None)
        # pairs as lists: the summary must equal its own JSON round trip
        out[f"{kind}/{attribute}"] = {"questions": len(group), "success": _rate(r["correct"] for r in group),
                                      "most_said": [[a, n] for a, n in said.most_common(3)]}
    return out


PICTURE_KINDS = ("visual", "detail")  # few attributes each, and what the picture alone must answer


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _ms(d: dict[str, Any], key: str) -> str:
    v = d.get(key)
    return "-" if v is None else f"{1e3 * v:.1f}"


def format_summary(summary: dict[str, Any], title: str = "") -> str:
    head = (f"{'kind':<10} {'n':>5} {'success':>8} {'turns':>6} {'move acc':>9} {'act acc':>8} "
            f"{'consist':>8} {'reason ms mean/p95':>19} {'action ms mean/p95':>19} {'model ms mean/p95':>18} "
            f"{'gen tok':>8}")
    lines = [title, head] if title else [head]
    rows = [*summary["kinds"].items(), ("overall", summary["overall"]), *summary.get("phrasing", {}).items()]
    for name, g in rows:
        lines.append(
            f"{name:<10} {g['questions']:>5} {_pct(g['success']):>8} {g['turns_mean'] or 0:>6.2f} "
            f"{_pct(g['move_accuracy']):>9} {_pct(g['action_accuracy']):>8} {_pct(g['consistency']):>8} "
            f"{_ms(g['reasoning_s'], 'mean') + ' / ' + _ms(g['reasoning_s'], 'p95'):>19} "
            f"{_ms(g['action_s'], 'mean') + ' / ' + _ms(g['action_s'], 'p95'):>19} "
            f"{_ms(g['model_s'], 'mean') + ' / ' + _ms(g['model_s'], 'p95'):>18} "
            f"{g['generated_tokens_mean'] or 0:>8.1f}")
    overall = summary["overall"]
    if overall.get("success_ci95") and overall["questions"]:
        low, high = overall["success_ci95"]
        lines.append(f"overall success {_pct(overall['success'])}, 95% interval {_pct(low)} - {_pct(high)} "
                     f"(Wilson, {overall['questions']} questions; `ssr-lab compare` pairs two evals); "
                     f"the kinds' mean {_pct(summary.get('kind_balanced_success'))}")
    for kind in PICTURE_KINDS:
        rows = [(key.split("/", 1)[1], g) for key, g in summary.get("attributes", {}).items()
                if key.startswith(kind + "/")]
        if rows:
            lines.append(f"{kind} by attribute: " + "; ".join(
                f"{attr} {_pct(g['success'])} of {g['questions']} (most said: "
                + ", ".join(f"{said} x{n}" for said, n in g["most_said"]) + ")" for attr, g in rows))
    zoom = summary["overall"].get("zoom_calls")
    if zoom:
        lines.append(f"zoom boxes on the target (the gold box's centre inside): "
                     f"{_pct(summary['overall']['zoom_on_target'])} of {zoom} zoom calls; the last call of "
                     f"each question: {_pct(summary['overall'].get('zoom_last_on_target'))}")
    if overall.get("actions_decoded"):
        lines.append("actions: " + forwards_line(overall["actions_decoded"], overall["action_tokens"],
                                                 overall["action_forwards"]))
    mix = summary["overall"]["candidate_mix"]
    if mix:
        lines.append("candidate mix: " + ", ".join(f"{k} {v}" for k, v in mix.items()))
    return "\n".join(lines)

"""What a build reports: question counts, the fingerprint of its files, a printable summary."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ssr_lab.world.records import KINDS, SPLITS, Question


def count_questions(questions: Sequence[Question]) -> dict[str, Any]:
    by = Counter((q.split, q.kind) for q in questions)
    return {"total": len(questions),
            "by_split": {s: sum(by[s, k] for k in KINDS) for s in SPLITS},
            "by_kind": {k: sum(by[s, k] for s in SPLITS) for k in KINDS},
            "by_split_kind": {s: {k: by[s, k] for k in KINDS} for s in SPLITS},
            "heldout_template": sum(q.heldout_template for q in questions)}


@dataclass(frozen=True)
class BuildReport:
    root: Path
    manifest: dict[str, Any]
    seconds: float

    def summary(self) -> str:
        m = self.manifest
        q, img, txt = m["questions"], m["calibration"]["image_search"], m["calibration"]["text_search"]
        lines = [f"world: {m['entities']} invented + {m['knowledge_entities']} knowledge entities, "
                 f"{m['documents']} documents, {q['total']} questions, seed {m['seed']} -> {self.root}",
                 f"{'split':<6}" + "".join(f"{k:>10}" for k in (*q["by_kind"], "total"))]
        for split, kinds in q["by_split_kind"].items():
            lines.append(f"{split:<6}" + "".join(f"{n:>10}" for n in kinds.values())
                         + f"{q['by_split'][split]:>10}")
        lines.append(f"image search on {img['views']} views (first draw): "
                     f"top-1 {img['first_draw_top1']:.2%}, top-3 {img['first_draw_top3']:.2%}; "
                     f"{img['redrawn_views']} redrawn until rank <= {img['required_rank']} "
                     f"(max attempt {img['max_attempt']})")
        lines.append(f"text search on {txt['text_searches']} gold queries: gold doc top-1 "
                     f"{txt['gold_doc_top1']:.2%}, top-5 {txt['gold_doc_top5']:.2%}, answer in top-5 "
                     f"{txt['answer_doc_top5']:.2%}; {txt['dropped_questions']} questions dropped")
        lines.append(f"built in {self.seconds:.1f} s; fingerprint {m['fingerprint'][:16]}")
        return "\n".join(lines)

"""SFT's copying drills: short text-only excerpts of real oracle trajectories, the copy in the loss."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from ssr_lab.train.data import Example
from ssr_lab.train.drills import Drills, DrillTokens, answer_drill, query_drills


@pytest.fixture(scope="module")
def replayed(world_dir: Path) -> tuple[Any, Any, dict[str, Example]]:
    from ssr_lab.train.setup import new_model, oracle_examples
    from ssr_lab.world import load_questions
    from ssr_server.core.formats.format import get_format
    from ssr_server.core.library import LibraryRegistry

    fmt, library = get_format(), LibraryRegistry().get("default")
    train = [q for q in load_questions(world_dir / "questions.jsonl") if q.split == "train"]
    _, tok = new_model("64x1", world_dir, train, fmt, library, 0)
    picked = [next(q for q in train if q.kind == kind)
              for kind in ("named", "search", "visual", "detail", "two_hop")]
    examples, dropped = asyncio.run(oracle_examples(world_dir, picked, tok, fmt, library, "ssr",
                                                    progress=False))
    assert dropped == 0
    return tok, fmt, {e.kind: e for e in examples}


def _said(tok: Any, ex: Example) -> str:
    return str(tok.decode([i for i, m in zip(ex.ids, ex.mask, strict=True) if m]))


def _turns(tok: Any, ex: Example) -> list[str]:
    text = tok.decode(list(ex.ids))
    return ["<|im_start|>" + t for t in text.split("<|im_start|>")[1:]]


def test_an_answer_drill_is_the_question_the_evidence_and_the_answer(replayed: Any) -> None:
    tok, fmt, ex = replayed
    t = DrillTokens.of(tok, fmt)
    for kind in ("named", "search"):
        full, drill = ex[kind], answer_drill(ex[kind], t)
        assert drill is not None and drill.key == full.key and drill.images == ()
        assert t.vision_start not in drill.ids
        whole, cut = _turns(tok, full), _turns(tok, drill)
        assert whole[0].startswith("<|im_start|>system") and len(cut) == 4
        assert cut[0].startswith("<|im_start|>user") and "<|vision_start|>" in whole[1]
        assert cut[0] == whole[1].replace("<|vision_start|><|image_pad|><|vision_end|>", "")
        assert cut[1:] == whole[-3:]  # the call, its text-only result and the answer, token for token
        said, said_full = _said(tok, drill), _said(tok, full)
        assert "<answer>" in said and said_full.endswith(said)
        # the call is predicted only when nothing it copies from was dropped (named: question -> call)
        if kind == "named":
            assert said == said_full and '"query"' in said
        else:
            assert "tool_call" not in said and said.count("<|im_end|>") == 1
    assert answer_drill(ex["visual"], t) is None  # one turn: nothing to copy from
    assert answer_drill(ex["detail"], t) is None  # its evidence is an image


def test_a_query_drill_ends_with_a_text_search_call(replayed: Any) -> None:
    tok, fmt, ex = replayed
    t = DrillTokens.of(tok, fmt)
    full, drills = ex["search"], query_drills(ex["search"], t)
    assert len(drills) == 1
    drill = drills[0]
    assert drill.images == () and t.vision_start not in drill.ids
    whole, cut = _turns(tok, full), _turns(tok, drill)
    assert len(cut) == 4  # question, image search, its results (titles kept), the text search
    assert cut[3] == whole[4] and '"query"' in cut[3]
    assert "Title:" in cut[2] and "<|vision_start|>" in whole[3]
    said = _said(tok, drill)
    assert said.count("<|im_end|>") == 1 and '"query"' in said and _said(tok, full).count(said) == 1
    assert "image_search" not in said and "<answer>" not in said
    assert query_drills(ex["visual"], t) == []
    # two-hop: one drill per call; the second holds the first call's result (the name it copies)
    full = ex["two_hop"]
    first, second = query_drills(full, t)
    whole, cut1, cut2 = _turns(tok, full), _turns(tok, first), _turns(tok, second)
    assert cut1 == cut2[:4] and len(cut2) == 6 and cut2[5] == whole[6] and '"query"' in cut2[5]
    assert cut2[4] == whole[5] and "Title:" not in cut2[4]  # the first search's text result
    said = _said(tok, second)
    assert said.count("<|im_end|>") == 1 and _said(tok, full).count(said) == 1 and said != _said(tok, first)
    # the pool: every call by default, the first only when asked (as the older models were trained)
    assert Drills.of([full], t).queries == [first, second]
    assert Drills.of([full], t, every_call=False).queries == [first]


def test_drills_follow_each_full_batch_deterministically() -> None:
    def ex(key: str) -> Example:
        return Example(key, "named", (1, 2), (False, True), ())

    drills = Drills([ex(f"a{i}") for i in range(50)], [ex(f"q{i}") for i in range(90)])
    full = [[ex("f0")] * 4, [ex("f1")] * 4]
    out = drills.interleave(full, 4, random.Random(0))
    assert [len(b) for b in out] == [4, 8, 16, 4, 8, 16]
    assert out[0] == full[0] and out[3] == full[1]
    assert all(e.key.startswith("a") for e in out[1]) and all(e.key.startswith("q") for e in out[2])
    assert out == drills.interleave(full, 4, random.Random(0)) != drills.interleave(full, 4, random.Random(1))
    assert Drills([], []).interleave(full, 4, random.Random(0)) == full


def test_sft_with_drills_trains_on_them(world_dir: Path, tmp_path: Path,
                                       sft_batches: list[list[Example]]) -> None:
    """`train sft --drills` reaches the batches: after a full batch, text-only drills without the
    system prompt; without the flag, every batch is whole trajectories."""
    from ssr_lab.train import sft

    batches = sft_batches

    def run(drills: bool) -> list[list[Example]]:
        batches.clear()
        sft.train_sft(sft.SFTConfig(world=world_dir, out=tmp_path / f"drills-{drills}", init="64x1", steps=3,
                                    batch_size=4, limit=48, warmup=1, threads=1, drills=drills,
                                    cache_examples=False), progress=False)
        return list(batches)

    plain, drilled = run(False), run(True)
    assert len(plain) == len(drilled) == 3
    assert all(len(b) == 4 for b in plain) and [len(b) for b in drilled] == [4, 8, 16]
    first = drilled[0][0].ids[0]  # every trajectory opens with the system turn; a drill with the question
    assert all(e.ids[0] == first for b in plain for e in b)
    for batch in drilled[1:]:
        assert all(not e.images and len(e.ids) < len(drilled[0][0].ids) and any(e.mask) for e in batch)

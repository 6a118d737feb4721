"""Oracle trajectories: every question's gold moves, through the real loop and tools, reach its answer."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ssr_lab.cli import app
from ssr_lab.eval.paraphrase import reasoning, templates
from ssr_lab.eval.trajectories import oracle_trajectories
from ssr_lab.world import KIND_MOVES, load_questions
from ssr_server.core.formats.format import get_format
from ssr_server.core.library import LibraryRegistry
from ssr_server.engine.tiny import build_tokenizer


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer("trained")


@pytest.mark.parametrize("mode", ["ssr", "freeform"])
async def test_every_oracle_trajectory_reaches_its_gold_answer(world_dir: Path, tokenizer: Any,
                                                               mode: str) -> None:
    questions = load_questions(world_dir / "questions.jsonl")
    assert {q.kind for q in questions} == set(KIND_MOVES)
    library = LibraryRegistry().get("default")
    fmt = get_format()
    surfaces = dict(zip(library.ids, fmt.candidate_surfaces(library), strict=True))
    n = 0
    async for t in oracle_trajectories(world_dir, questions, tokenizer, mode=mode):
        n += 1
        assert t.problems == (), (t.question.id, t.problems)  # the tools returned the evidence
        assert t.run.outcome == "answered" and t.run.answer == t.question.answer
        assert [turn.action_type for turn in t.run.turns] == [m.action for m in t.question.moves]
        text = tokenizer.decode(list(t.context.token_ids), skip_special_tokens=False)
        assert text.endswith(f"<answer>{t.question.answer}</answer><|im_end|>\n")
        if mode == "ssr":  # the gold rationales, pasted in order, each followed by its action
            assert [turn.candidate_id for turn in t.run.turns] == [m.move for m in t.question.moves]
            pos = 0
            for turn in t.run.turns:
                pos = text.index(surfaces[turn.candidate_id] + turn.action_text, pos) + 1  # type: ignore[index]
        else:
            assert all(turn.candidate_id is None and turn.reasoning_tokens > 0 for turn in t.run.turns)
            answer_part = text.split("<|im_start|>assistant\n", 1)[1]
            assert answer_part.count("<thinking>") == len(t.run.turns)  # one reasoning block per turn
    assert n == len(questions)


def test_freeform_reasoning_is_varied_and_sized(world_dir: Path) -> None:
    """At least eight templates per move; every paragraph 20-80 tokens (real Qwen vocabulary)."""
    qwen = build_tokenizer("qwen")
    questions = load_questions(world_dir / "questions.jsonl")
    for move in {m for moves in KIND_MOVES.values() for m in moves}:
        assert len(set(templates(move))) >= 8
    seen: dict[str, set[str]] = {}
    for q in questions:
        for i, m in enumerate(q.moves):
            text = reasoning(q, i)
            n = len(qwen.encode(text, add_special_tokens=False))
            assert 20 <= n <= 80, (q.id, i, n, text)
            assert "{" not in text  # every field filled
            seen.setdefault(m.move, set()).add(text)
            if m.move == "r_LOOKUP_FACT" and ">" not in q.attribute:
                assert q.entity in text  # a look-up names what it looks up
            if m.move == "r_IDENTIFY_BY_IMAGE":
                assert q.entity not in text  # ...but before the image search the name is not known
    assert all(len(v) >= 8 for v in seen.values())


def test_trajectories_command_writes_jsonl(world_dir: Path, tmp_path: Path, tiny_model_dir: Path) -> None:
    out = tmp_path / "traj.jsonl"
    r = CliRunner().invoke(app, ["world", "trajectories", str(world_dir), "--out", str(out), "--mode",
                                 "freeform",
                                 "--split", "dev", "--limit", "12"],
                           env={**os.environ, "SSR_MODEL": str(tiny_model_dir)})
    assert r.exit_code == 0, r.output
    assert "oracle replay success 12/12" in r.output
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    kinds = {q.kind for q in load_questions(world_dir / "questions.jsonl") if q.split == "dev"}
    assert len(rows) == 12 and {row["question"]["kind"] for row in rows} == kinds
    for row in rows:
        assert row["problems"] == [] and row["question"]["split"] == "dev"
        assert row["context_text"].startswith("<|im_start|>system\n")


@pytest.mark.parametrize("library", ["generic-1", "binary-2"])
async def test_oracle_plays_the_ablation_libraries(world_dir: Path, tokenizer: Any, library: str) -> None:
    """A library without the gold rationales: the oracle picks one allowing the gold action, and the
    action itself is then chosen among the openings, as at serving time."""
    lib = LibraryRegistry().get(library)
    questions = [q for q in load_questions(world_dir / "questions.jsonl") if q.split == "dev"][:12]
    async for t in oracle_trajectories(world_dir, questions, tokenizer, library=lib):
        assert t.problems == (), t.problems
        for turn, move in zip(t.run.turns, t.question.moves, strict=True):
            assert turn.candidate_id in lib.ids and turn.action_type == move.action

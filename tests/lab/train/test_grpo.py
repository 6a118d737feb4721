"""SSR-GRPO on the real loop: rollouts score what the engine served, the first update's ratios are 1."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ssr_lab.train.grpo import GRPOConfig, collect, rollout_loss, train_grpo, with_advantages
from ssr_lab.train.policy import Rollout, policy_terms
from ssr_lab.world import load_questions


@pytest.fixture(scope="module")
def rollouts(world_dir: Path, tiny_model_dir: Path) -> list[Rollout]:
    qs = [q for q in load_questions(world_dir / "questions.jsonl") if q.split == "train"]
    picked = [next(q for q in qs if q.kind == k) for k in ("search", "detail", "two_hop")]
    cfg = GRPOConfig(world=world_dir, init=tiny_model_dir, out=Path("unused"), group=3, threads=1,
                     max_turns=4)
    return with_advantages(asyncio.run(collect(cfg, tiny_model_dir, picked, seed=0)))


@pytest.fixture(scope="module")
def setup(tiny_model_dir: Path) -> tuple:  # type: ignore[type-arg]
    from transformers import AutoImageProcessor

    from ssr_lab.train.data import Collator
    from ssr_lab.train.setup import load_model
    from ssr_server.core.formats.format import get_format
    from ssr_server.core.library import LibraryRegistry

    model, tok = load_model(tiny_model_dir)
    model.eval()
    lib = LibraryRegistry().get("default")
    cands = [list(c) for c in lib.candidate_token_ids(tok, get_format().candidate_surfaces(lib))]
    collator = Collator(model, AutoImageProcessor.from_pretrained(tiny_model_dir, backend="pil"), 0)
    return model, collator, cands


def test_rollouts_are_grouped_with_normalised_advantages(rollouts: list[Rollout]) -> None:
    assert len(rollouts) == 9
    for qid in {r.question_id for r in rollouts}:
        group = [r for r in rollouts if r.question_id == qid]
        assert len(group) == 3 and abs(sum(r.advantage for r in group)) < 1e-5
        assert all(r.reward in (0.0, 0.1, 1.1) for r in group)


def test_recomputed_scores_are_the_served_ones(rollouts: list[Rollout], setup: tuple) -> None:  # type: ignore[type-arg]
    """The trainer's candidate scores (the chosen one read off the trajectory, the others branched off
    it) equal what the engine computed when it selected; both modes read the chosen one the same way."""
    model, collator, cands = setup
    checked = 0
    with torch.no_grad():
        for r in rollouts:
            full = policy_terms(model, collator, r, cands, all_scores=True)
            chosen_only = policy_terms(model, collator, r, cands, all_scores=False)
            ssr_turns = [t for t in r.turns if t.chosen is not None]
            assert len(full.scores) == len(ssr_turns) == len(r.turns)
            for t, s, c in zip(ssr_turns, full.scores, chosen_only.scores, strict=True):
                assert t.served_scores is not None
                torch.testing.assert_close(s, torch.tensor(t.served_scores, dtype=s.dtype), atol=1e-4, rtol=0)
                assert float(c[t.chosen]) == float(s[t.chosen])
                checked += 1
            # every decoded action token has its log-probability
            assert [len(x) for x in full.token_logps] == [t.action[1] - t.action[0] for t in r.turns]
    assert checked >= 9


@pytest.mark.parametrize("selector_grad", ["exact", "detached"])
def test_first_update_ratios_are_one_and_nothing_clips(rollouts: list, setup: tuple,  # type: ignore[type-arg]
                                                       selector_grad: str) -> None:
    model, collator, cands = setup
    cfg = GRPOConfig(world=Path("w"), init=Path("i"), out=Path("o"),
                     selector_grad=selector_grad)  # type: ignore[arg-type]
    r = next(r for r in rollouts if r.advantage != 0.0) if any(r.advantage for r in rollouts) else rollouts[0]
    r = type(r)(**{**r.__dict__, "advantage": 1.0})
    with torch.no_grad():
        old = policy_terms(model, collator, r, cands, all_scores=True)
    new = policy_terms(model, collator, r, cands, all_scores=selector_grad == "exact")
    sel, tok, stats = rollout_loss(cfg, new, old, None, r)
    assert stats["ratio_sel"] == 1.0 and stats["clip_sel"] == 0.0 and stats["clip_tok"] == 0.0
    assert torch.equal(sel.detach(), torch.full_like(sel, -1.0))  # -min(1 * A, clip(1) * A), A = 1
    assert torch.equal(tok.detach(), torch.full_like(tok, -1.0))
    (sel.sum() + tok.sum()).backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    model.zero_grad(set_to_none=True)


@pytest.mark.slow
def test_one_grpo_iteration_end_to_end(world_dir: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "grpo"
    figures = train_grpo(GRPOConfig(world=world_dir, init=tiny_model_dir, out=out, iterations=1, questions=2,
                                    group=2, epochs=1, threads=1, max_turns=3, kinds=("detail",),
                                    freeze_vision=True, anchor=1.0, anchor_batch=2, anchor_rename=True,
                                    anchor_rephrase=0.5), progress=False)
    assert figures["iterations"] == 1
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert log[0]["rollouts"] == 4 and 0.0 <= log[0]["success"] <= 1.0
    assert log[0]["kinds"] == {"detail": 2}
    assert 0.0 < log[0]["anchor_ce"] < 20.0  # the oracle trajectories' cross-entropy under the model
    assert (out / "model.safetensors").is_file() and "## Reproduce" in (out / "README.md").read_text()
    # the anchor steps even when every group agrees: the language model moved, the frozen tower did not
    before, after = load_file(tiny_model_dir / "model.safetensors"), load_file(out / "model.safetensors")
    tower = [k for k in before if ".visual." in k]
    assert tower and all(torch.equal(before[k], after[k]) for k in tower)
    assert any(not torch.equal(before[k], after[k]) for k in before if ".language_model." in k)

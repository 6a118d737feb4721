"""``ssr-lab train grpo``: group-relative policy optimisation through the real agent loop.

Each iteration: the current policy is loaded into the embedded engine; G rollouts per question run
through the agent loop and the world's tools (SSR: the rationale sampled from q at tau, actions
sampled; freeform: reasoning and actions sampled); reward = the answer is correct, plus a small term for
answering at all; advantages are normalised within each question's group. Then a few epochs of PPO-style
updates: per SSR turn ONE categorical ratio over the chosen candidate (``objective.py``), per action
token its own ratio (GRPO) or one per action (GSPO), clipped; freeform trains its reasoning tokens like
its action tokens. Old log-probabilities come from a no-gradient pass with the pre-update weights, so
the first update's ratios are exactly 1.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import random
import tempfile
import time
import zlib
from collections import Counter, defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from ssr_lab.eval.trajectories import question_image, world_tools
from ssr_lab.train.anchor import SFTAnchor
from ssr_lab.train.checkpoint import latest_checkpoint, reproduce, resume, save_checkpoint, write_card
from ssr_lab.train.config.grpo import GRPOConfig as GRPOConfig  # re-exported: its old home
from ssr_lab.train.data import Collator, Example, png
from ssr_lab.train.objective import (
    action_log_ratios,
    clipped_fraction,
    clipped_surrogate,
    group_advantages,
    k3_kl,
    selection_log_ratio,
)
from ssr_lab.train.policy import PolicyTerms, Rollout, TurnRecord, policy_terms
from ssr_lab.train.setup import load_model, split_questions, trainable
from ssr_lab.world.records import Question, load_questions
from ssr_server.agent.loop import Agent, RunOptions
from ssr_server.core.answers import is_correct
from ssr_server.core.formats.format import get_format
from ssr_server.core.library import LibraryRegistry
from ssr_server.core.progress import progress_bar
from ssr_server.engine.tiny import read_pixels, save_model, write_processor_config


async def collect(cfg: GRPOConfig, policy: Path, questions: list[Question], seed: int) -> list[Rollout]:
    """G rollouts of each question through the agent loop on the embedded engine."""
    from ssr_server.engine.torch.config import EngineConfig
    from ssr_server.engine.torch.engine import TorchEngine

    engine = TorchEngine(str(policy), EngineConfig(threads=cfg.threads, prefix_cache_bytes=256 << 20))
    tools = world_tools(cfg.world)
    agent = Agent(engine, tools, LibraryRegistry(), get_format())
    library = agent.libraries.get("default")
    options = RunOptions(mode=cfg.format, tau=cfg.tau, action_temperature=cfg.temperature,
                         max_turns=cfg.max_turns, reasoning_budget=cfg.reasoning_budget)
    gate = asyncio.Semaphore(cfg.concurrency)

    async def one(q: Question, g: int) -> Rollout | None:
        async with gate:
            # crc32, not hash(): str hashes differ per process, and a seeded run must repeat.
            run_seed = seed * 1_000_003 + zlib.crc32(q.id.encode()) % 100_003 * 31 + g
            run, ctx = await agent.run_with_context(
                q.question, [question_image(cfg.world, q)], dataclasses.replace(options, seed=run_seed))
        correct = run.outcome == "answered" and is_correct(run.answer or "", q.answer, q.aliases)
        turns = tuple(TurnRecord(t.reasoning_span, t.action_span,
                                 library.ids.index(t.candidate_id) if t.candidate_id else None,
                                 tuple(t.scores) if t.scores else None)
                      for t in run.turns)
        example = Example(f"{q.id}/{g}", q.kind, ctx.token_ids, (False,) * len(ctx),
                          tuple(png(ref.image) for ref in ctx.images))
        reward = float(correct) + cfg.format_reward * (run.outcome == "answered")
        return Rollout(f"{q.id}/{g}", q.id, example, turns, reward, correct)

    try:
        done = await asyncio.gather(*(one(q, g) for q in questions for g in range(cfg.group)),
                                    return_exceptions=True)
    finally:
        await tools.aclose()
        await engine.close()
    return [r for r in done if isinstance(r, Rollout)]


def with_advantages(rollouts: list[Rollout]) -> list[Rollout]:
    groups: dict[str, list[Rollout]] = defaultdict(list)
    for r in rollouts:
        groups[r.question_id].append(r)
    out = []
    for group in groups.values():
        adv = group_advantages(torch.tensor([r.reward for r in group]))
        out += [dataclasses.replace(r, advantage=float(a)) for r, a in zip(group, adv, strict=True)]
    return out


def rollout_loss(cfg: GRPOConfig, new: PolicyTerms, old: PolicyTerms, ref: PolicyTerms | None,
                 rollout: Rollout) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Summed selection and token losses of one rollout (aggregation divides by the batch weight)."""
    adv = rollout.advantage
    sel, sel_ratio = [], []
    ssr_turns = [t for t in rollout.turns if t.chosen is not None]
    for turn, s_new, s_old in zip(ssr_turns, new.scores, old.scores, strict=True):
        lr = selection_log_ratio(s_new, s_old, int(turn.chosen or 0), cfg.tau, cfg.selector_grad)
        sel.append(clipped_surrogate(lr, adv, cfg.clip))
        sel_ratio.append(lr)
    tok, tok_ratio = [], []
    for i, (lp_new, lp_old) in enumerate(zip(new.token_logps, old.token_logps, strict=True)):
        if lp_new.numel() == 0:
            continue
        lr = action_log_ratios(lp_new, lp_old, cfg.ratio_level)
        loss = clipped_surrogate(lr, adv, cfg.clip)
        if ref is not None and cfg.kl > 0:
            loss = loss + cfg.kl * k3_kl(lp_new, ref.token_logps[i])
        tok.append(loss)
        tok_ratio.append(lr)
    sel_t = torch.stack(sel) if sel else torch.zeros(0)
    tok_t = torch.cat(tok) if tok else torch.zeros(0)
    stats = {"clip_sel": float(clipped_fraction(torch.stack(sel_ratio), adv, cfg.clip)) if sel_ratio else 0.0,
             "clip_tok": float(clipped_fraction(torch.cat(tok_ratio), adv, cfg.clip)) if tok_ratio else 0.0,
             "ratio_sel": float(torch.exp(torch.stack(sel_ratio).detach()).mean()) if sel_ratio else 1.0}
    return sel_t, tok_t, stats


def train_grpo(cfg: GRPOConfig, progress: bool = True) -> dict[str, Any]:
    from transformers import AutoImageProcessor

    started = time.perf_counter()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    model, tok = load_model(cfg.init)
    pixels = read_pixels(cfg.init)
    reference = copy.deepcopy(model).eval() if cfg.kl > 0 else None
    fmt = get_format()
    library = LibraryRegistry().get("default")
    cand_ids = ([list(c) for c in library.candidate_token_ids(tok, fmt.candidate_surfaces(library))]
                if cfg.format == "ssr" else None)
    train_qs = split_questions(load_questions(cfg.world / "questions.jsonl"), "train", None, cfg.seed)
    questions = [q for q in train_qs if not cfg.kinds or q.kind in cfg.kinds]
    if len(questions) < cfg.questions:
        raise ValueError(f"{len(questions)} training questions of kinds {cfg.kinds or 'all'}; "
                         f"an iteration draws {cfg.questions}")
    cfg.out.mkdir(parents=True, exist_ok=True)
    write_processor_config(cfg.out, pixels)
    processor = AutoImageProcessor.from_pretrained(cfg.out, backend="pil")
    collator = Collator(model, processor, tok.pad_token_id or 0)
    anchor = (SFTAnchor.of(cfg.world, train_qs, tok, fmt, library, cfg.format, cfg.anchor_zoom, cfg.anchor,
                           cfg.anchor_batch, cfg.anchor_rename, cfg.anchor_rephrase)
              if cfg.anchor > 0 else None)
    trained = trainable(model, cfg.freeze_vision)
    optimizer = torch.optim.AdamW(trained, lr=cfg.lr, betas=(0.9, 0.98), weight_decay=0.0)
    config = {k: str(v) for k, v in asdict(cfg).items()}
    commands = reproduce(cfg.world, cfg.init)
    meta: dict[str, Any] = {"config": config, "command": "\n".join(commands), "commands": commands}
    iteration = 0
    ckpt = latest_checkpoint(cfg.out)
    if ckpt is not None:
        iteration = resume(ckpt, model, optimizer)
    log_path = cfg.out / "train_log.jsonl"
    history: list[dict[str, Any]] = []
    train_reasoning = cfg.format == "freeform"
    bar = progress_bar(total=cfg.iterations, initial=iteration, desc=f"grpo {cfg.format}", unit="iter",
                       disable=not progress)
    with tempfile.TemporaryDirectory(prefix="ssr-grpo-policy-") as tmp:
        while iteration < cfg.iterations and (time.perf_counter() - started) / 60 < cfg.max_minutes:
            batch_qs = rng.sample(questions, cfg.questions)
            model.eval()
            save_model(model, tok, tmp, {"grpo_iteration": iteration}, pixels)
            t0 = time.perf_counter()
            rollouts = with_advantages(asyncio.run(collect(cfg, Path(tmp), batch_qs, cfg.seed + iteration)))
            rollout_s = time.perf_counter() - t0
            items = [r for r in rollouts if r.advantage != 0.0]
            with torch.no_grad():
                olds = {r.key: policy_terms(model, collator, r, cand_ids, all_scores=True,
                                            train_reasoning=train_reasoning) for r in items}
                refs = ({r.key: policy_terms(reference, collator, r, None, all_scores=False,
                                             train_reasoning=train_reasoning) for r in items}
                        if reference is not None else {})
            model.train()
            stats: list[dict[str, float]] = []
            anchor_losses: list[float] = []
            for _ in range(cfg.epochs):
                rng.shuffle(items)
                # with an anchor, a batch whose groups all agree still takes one (anchor-only) step
                minibatches = ([items[i : i + cfg.minibatch] for i in range(0, len(items), cfg.minibatch)]
                               or ([[]] if anchor is not None else []))
                for mb in minibatches:
                    weight = sum(cfg.gamma * len(olds[r.key].scores)
                                 + sum(t.numel() for t in olds[r.key].token_logps) for r in mb)
                    optimizer.zero_grad(set_to_none=True)
                    for r in mb:
                        new = policy_terms(model, collator, r, cand_ids,
                                           all_scores=cfg.selector_grad == "exact",
                                           train_reasoning=train_reasoning)
                        sel, tok_l, st = rollout_loss(cfg, new, olds[r.key], refs.get(r.key), r)
                        loss = (cfg.gamma * sel.sum() + tok_l.sum()) / max(weight, 1e-9)
                        loss.backward()  # type: ignore[no-untyped-call]
                        stats.append(st)
                    if anchor is not None:
                        anchor_loss, _ = anchor.loss(model, collator, rng)
                        anchor_loss.backward()  # type: ignore[no-untyped-call]
                        anchor_losses.append(float(anchor_loss.detach()) / cfg.anchor)
                    torch.nn.utils.clip_grad_norm_(trained, 1.0)
                    optimizer.step()
            iteration += 1
            record = {
                "iteration": iteration, "rollouts": len(rollouts), "trained": len(items),
                "kinds": dict(Counter(q.kind for q in batch_qs)),
                "anchor_ce": sum(anchor_losses) / len(anchor_losses) if anchor_losses else None,
                "reward_mean": sum(r.reward for r in rollouts) / max(1, len(rollouts)),
                "success": sum(r.correct for r in rollouts) / max(1, len(rollouts)),
                "rollout_s": rollout_s, "minutes": (time.perf_counter() - started) / 60,
                **{k: sum(s[k] for s in stats) / max(1, len(stats))
                   for k in ("clip_sel", "clip_tok", "ratio_sel")},
            }
            history.append(record)
            with log_path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
            bar.update(1)
            bar.set_postfix(success=f"{record['success']:.2f}", reward=f"{record['reward_mean']:.2f}",
                            refresh=False)
            save_checkpoint(cfg.out, model, tok, optimizer, iteration, meta, pixels=pixels)
    bar.close()
    model.eval()
    save_model(model, tok, cfg.out, {"trained": "grpo", **config, "commands": commands}, pixels)
    figures = {"iterations": iteration, "minutes": (time.perf_counter() - started) / 60,
               "first_success": history[0]["success"] if history else None,
               "last_success": history[-1]["success"] if history else None}
    write_card(cfg.out, {"title": f"SSR {cfg.format}-GRPO (from {cfg.init})", "command": meta["command"],
                         "description": "RL through the real agent loop on the world's training questions.",
                         **figures, **{f"config.{k}": v for k, v in config.items()}})
    return figures

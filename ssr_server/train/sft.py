"""``ssr-server train sft``: supervised fine-tuning on a world's oracle trajectories.

Plain PyTorch rather than TRL's SFTTrainer: the two things that make training affordable on two CPU
cores are not in TRL's multimodal path - the loss restricted to assistant tokens of multi-turn,
multi-image trajectories, and the shared system-prompt prefix run once per batch (a third of the
tokens; see ``data.py``). The loop is AdamW, linear warm-up then cosine decay, gradient clipping,
deterministic for a seed, with resumable checkpoints and a bounded wall-clock budget.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ssr_server.engine.tiny import DEFAULT_PIXELS, read_pixels, save_model, write_processor_config
from ssr_server.formats.format import get_format
from ssr_server.library import LibraryRegistry
from ssr_server.progress import progress_bar
from ssr_server.train.checkpoint import latest_checkpoint, reproduce, resume, save_checkpoint, write_card
from ssr_server.train.contrast import contrast_drills
from ssr_server.train.copying import CopyTask, copy_loss
from ssr_server.train.data import Collator, Example, batches, token_logits
from ssr_server.train.drills import Drills, DrillTokens
from ssr_server.train.grow import grow_language_model
from ssr_server.train.look_search import search_counts
from ssr_server.train.look_zoom import SIGN_ATTRIBUTES, zoom_looks
from ssr_server.train.picture_drills import PictureDrills
from ssr_server.train.rename import Renamer
from ssr_server.train.rephrase import Rephraser
from ssr_server.train.schedule import budget_step, cosine_lr
from ssr_server.train.setup import (
    load_model,
    new_model,
    oracle_examples,
    param_groups,
    split_questions,
    trainable,
    zoom_styled,
)
from ssr_server.world.build import world_entities
from ssr_server.world.records import load_questions

COPY, PICTURES = "copy", "pictures"  # schedule entries that are not a batch of trajectories


@dataclass(frozen=True)
class SFTConfig:
    world: Path
    out: Path
    format: str = "ssr"  # ssr | freeform: the trajectories' form
    init: str = "256x4"  # a shape HxL (fresh model, world tokenizer) or a model folder
    library: str = "default"
    label_only: bool = False
    steps: int = 1500
    batch_size: int = 16
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup: int = 100
    weight_decay: float = 0.01
    clip: float = 1.0
    seed: int = 0
    limit: int | None = None  # at most this many training questions
    paraphrases: int = 2  # freeform: reasoning paraphrases per question
    max_minutes: float = 28.0  # stop (and save) before this much wall clock has passed
    anneal_by_time: bool = False  # the schedule also advances with the budget spent (not deterministic)
    save_every: int = 250
    log_every: int = 10
    threads: int | None = None
    cache_examples: bool = True  # keep the replayed trajectories under world/.cache (5 min per 18k)
    rename: bool = False  # a fresh invented name for the entity each time an example is drawn (rename.py)
    drills: bool = False  # interleave batches of short copying drills (drills.py)
    drill_sizes: tuple[int, int] = (2, 4)  # answer and query drill batches, in multiples of batch_size
    drill_calls: str = "first"  # query drills of each trajectory's first text search, or "all" of them
    drills_repeat: bool = False  # drills drawn from the --repeat-weighted pool (else each trajectory once)
    rephrase: float = 0.0  # share of drawn fact and two-hop questions asked in other words (rephrase.py)
    rephrase_pictures: bool = False  # visual and detail questions too, in trajectories and picture drills
    rephrase_refs: bool = False  # picture references from rephrase.MORE_PICTURE_ALTERNATIVES
    rephrase_openings: bool = False  # picture questions' stems from rephrase.OPENING_STEMS too
    drill_contrast: bool = False  # each two-hop second query drill also asked the other way (contrast.py)
    copy_every: int = 0  # every Nth step is a batch of the synthetic copying task (copying.py); 0: never
    copy_warmup: int = 0  # steps of the copying task alone before the first SFT batch (lengths widen
    # over the first 80% of them: copying.py)
    copy_batch: int = 32  # rows per copying batch
    repeat: tuple[tuple[str, int], ...] = ()  # (kind, n): that kind's examples n times per epoch
    pictures_every: int = 0  # every Nth step is a batch of picture drills (picture_drills.py); 0: never;
    # 1: every step (a reading phase: no trajectory batches at all)
    pictures_batch: int = 32  # drills per picture batch
    picture_moves: bool = True  # picture drills include first moves, not only reading (visual/detail)
    freeze_vision: bool = False  # the vision tower (and its deepstack mergers) stays as loaded: what
    # `train vision` taught it (e.g. where the plaque is) cannot drift away under the answers' gradients
    zoom: str = "tight"  # the zoom box detail trajectories and drills write (views.styled_box)
    zoom_jitter: float = 0.0  # picture drills' crops move sideways by up to this many gold widths
    zoom_edge_jitter: float = 0.0  # then each crop edge by up to this share of the gold box's size
    zoom_retry: float = 0.0  # share of plaque drills whose first zoom misses, the second finds it
    zoom_sign: bool = False  # sign questions zoom on the big sign before answering (look_zoom.py)
    zoom_sign_on: tuple[str, ...] = SIGN_ATTRIBUTES  # ... those asking for these attributes
    zoom_count: bool = False  # count questions zoom on the motif before answering
    search_count: bool = False  # count questions searched: image, then text, then answer (look_search.py)
    grow_layers: int = 0  # identity layers appended to the language model before training (grow.py)
    vision_lr_scale: float = 1.0  # the tower's learning rate as a share of the run's (setup.param_groups)


def _lr(step: int, cfg: SFTConfig) -> float:
    return cosine_lr(step, cfg.lr, cfg.warmup, cfg.steps, cfg.min_lr_ratio)


def train_sft(cfg: SFTConfig, progress: bool = True) -> dict[str, Any]:
    """Train, save ``cfg.out`` (model + card + log) and return the run's figures."""
    from transformers import AutoImageProcessor

    started = time.perf_counter()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    random.seed(cfg.seed)
    fmt = get_format()
    library = LibraryRegistry().get(cfg.library)
    questions = zoom_styled(split_questions(load_questions(cfg.world / "questions.jsonl"), "train", cfg.limit,
                                            cfg.seed), cfg.zoom)
    targets = [t for t, on in (("sign", cfg.zoom_sign), ("motif", cfg.zoom_count)) if on]
    if targets:
        questions = zoom_looks(cfg.world, questions, world_entities(cfg.world), targets, cfg.zoom,
                               cfg.zoom_sign_on)
    if cfg.search_count:
        if cfg.zoom_count:
            raise ValueError("a count question either zooms on the motif or searches by image, not both")
        questions = search_counts(questions, world_entities(cfg.world))
    pixels = DEFAULT_PIXELS
    if Path(cfg.init).is_dir():
        model, tok = load_model(cfg.init)
        pixels = read_pixels(cfg.init)  # the tower learnt to see pictures at this size: keep it
    else:
        model, tok = new_model(cfg.init, cfg.world, questions, fmt, library, cfg.seed)
    if cfg.grow_layers:  # before the optimizer and any resume: a checkpoint of this run is the grown model
        grow_language_model(model, cfg.grow_layers)
    mode = "freeform" if cfg.format == "freeform" else "ssr"
    if cfg.label_only and mode != "ssr":
        raise ValueError("label_only applies to ssr trajectories")
    examples, dropped = asyncio.run(oracle_examples(
        cfg.world, questions, tok, fmt, library, mode, paraphrase_seeds=tuple(range(cfg.paraphrases)),
        progress=progress, label_only=cfg.label_only, cache=cfg.cache_examples))
    if not examples:
        raise ValueError(f"no training examples in {cfg.world} (split train)")
    data_minutes = (time.perf_counter() - started) / 60
    cfg.out.mkdir(parents=True, exist_ok=True)
    write_processor_config(cfg.out, pixels)  # the image processing every loader of the result will use
    processor = AutoImageProcessor.from_pretrained(cfg.out, backend="pil")
    collate = Collator(model, processor, tok.pad_token_id or 0)
    renamer = Renamer(tok, questions) if cfg.rename else None
    rephraser = (Rephraser(tok, questions, cfg.rephrase, cfg.rephrase_pictures, cfg.rephrase_refs,
                           cfg.rephrase_openings) if cfg.rephrase else None)
    trained = trainable(model, cfg.freeze_vision)
    optimizer = torch.optim.AdamW(param_groups(model, trained, cfg.vision_lr_scale), lr=cfg.lr,
                                  betas=(0.9, 0.98), weight_decay=cfg.weight_decay)
    config = {k: str(v) for k, v in asdict(cfg).items()}
    commands = reproduce(cfg.world, cfg.init)
    meta: dict[str, Any] = {"config": config, "command": "\n".join(commands), "commands": commands}
    step = 0
    ckpt = latest_checkpoint(cfg.out)
    if ckpt is not None:
        step = resume(ckpt, model, optimizer)
    rng = random.Random(cfg.seed)
    order: list[list[Example] | str] = [COPY] * cfg.copy_warmup
    epoch = regular = 0
    times = dict(cfg.repeat)
    pool = [e for e in examples for _ in range(times.get(e.kind, 1))]
    drills = (Drills.of(pool if cfg.drills_repeat else examples, DrillTokens.of(tok, fmt),
                        every_call=cfg.drill_calls == "all") if cfg.drills else None)
    contrasts = 0
    if drills is not None and cfg.drill_contrast:  # its own RNG: the schedule's draws stay as they were
        flips = contrast_drills(drills.queries, questions, tok, random.Random(cfg.seed + 0xC0))
        drills = Drills(drills.answers, drills.queries + flips)
        contrasts = len(flips)
    if cfg.pictures_every == 1:  # a reading phase: picture drills only
        order += [PICTURES] * max(0, cfg.steps - len(order))
    while len(order) < cfg.steps:  # the whole schedule up front: resuming replays the same batches
        epoch_batches = batches(pool, cfg.batch_size, rng)
        for batch in (drills.interleave(epoch_batches, cfg.batch_size, rng, cfg.drill_sizes) if drills
                      else epoch_batches):
            order.append(batch)
            regular += 1
            if cfg.pictures_every > 1 and regular % (cfg.pictures_every - 1) == 0:
                order.append(PICTURES)
            if cfg.copy_every > 1 and regular % (cfg.copy_every - 1) == 0:
                order.append(COPY)
        epoch += 1
    copying = CopyTask.for_tokenizer(tok)
    copy_steps = sum(b == COPY for b in order[: cfg.steps])
    picture_steps = sum(b == PICTURES for b in order[: cfg.steps])
    pictures = (PictureDrills.of(examples, questions, world_entities(cfg.world), tok, fmt,
                                 moves=cfg.picture_moves, zoom=cfg.zoom, zoom_jitter=cfg.zoom_jitter,
                                 zoom_edge_jitter=cfg.zoom_edge_jitter, zoom_retry=cfg.zoom_retry)
                if cfg.pictures_every else None)
    if pictures is not None and not pictures.sources:
        raise ValueError("--pictures-every: no visual or detail trajectory to draw pictures for")
    log_path = cfg.out / "train_log.jsonl"
    model.train()
    bar = progress_bar(total=cfg.steps, initial=step, desc=f"sft {mode}", unit="step", disable=not progress)
    ema: float | None = None
    tokens_seen, t_mark, first_loss = 0, time.perf_counter(), None
    stopped_early = False
    with log_path.open("a", encoding="utf-8") as log:
        while step < cfg.steps:
            drawn = order[step]
            at = (budget_step(step, cfg.steps, (time.perf_counter() - started) / 60, cfg.max_minutes)
                  if cfg.anneal_by_time else step)
            for group in optimizer.param_groups:
                group["lr"] = _lr(at, cfg) * group["scale"]
            if drawn == COPY:  # seeded per step, like the names: a resumed run draws the same rows
                generator = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
                widened = step / (0.8 * cfg.copy_warmup) if cfg.copy_warmup else 1.0
                loss, tokens = copy_loss(model, copying, cfg.copy_batch, generator, widened)
            else:
                if isinstance(drawn, str):  # PICTURES; seeded per step, like the names
                    assert pictures is not None  # the schedule holds PICTURES only with picture drills
                    drawn = pictures.draw(cfg.pictures_batch, random.Random(cfg.seed * 1_000_003 + step))
                    if rephraser is not None and cfg.rephrase_pictures:  # its own RNG: the drills stay
                        drawn = rephraser(drawn, random.Random(cfg.seed * 1_000_003 + step + 0x91C))
                else:  # seeded per step: a resumed run draws the same names and phrasings
                    if rephraser is not None:  # before renaming: it finds the question as written
                        drawn = rephraser(drawn, random.Random(cfg.seed * 1_000_003 + step + 0x5EED))
                    if renamer is not None:
                        drawn = renamer(drawn, random.Random(cfg.seed * 1_000_003 + step))
                collated = collate(drawn)
                loss = torch.nn.functional.cross_entropy(token_logits(model, collated), collated.targets)
                tokens = collated.tokens
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(trained, cfg.clip)
            optimizer.step()
            step += 1
            value = float(loss.detach())
            first_loss = value if first_loss is None else first_loss
            ema = value if ema is None else 0.95 * ema + 0.05 * value
            tokens_seen += tokens
            elapsed = time.perf_counter() - t_mark
            bar.update(1)
            bar.set_postfix(loss=f"{ema:.3f}", tok_s=f"{tokens_seen / max(elapsed, 1e-9):.0f}",
                            refresh=False)
            if step % cfg.log_every == 0 or step == cfg.steps:
                log.write(json.dumps({"step": step, "loss": value, "loss_ema": ema,
                                      "lr": optimizer.param_groups[0]["lr"],
                                      "tokens_per_s": tokens_seen / max(elapsed, 1e-9)}) + "\n")
                log.flush()
            out_of_time = (time.perf_counter() - started) / 60 > cfg.max_minutes
            if step % cfg.save_every == 0 or out_of_time:
                save_checkpoint(cfg.out, model, tok, optimizer, step, meta, pixels=pixels)
            if out_of_time:
                stopped_early = True
                break
    bar.close()
    figures = {
        "steps": step, "planned_steps": cfg.steps, "stopped_at_time_budget": stopped_early,
        "examples": len(examples), "dropped_trajectories": dropped, "epochs_planned": epoch,
        "first_loss": first_loss, "final_loss_ema": ema, "minutes": (time.perf_counter() - started) / 60,
        "data_minutes": data_minutes,
        "drills": f"{len(drills.answers)} answer, {len(drills.queries)} query" if drills else "none",
        "contrast_drills": contrasts,
        "copy_steps_planned": copy_steps,
        "picture_steps_planned": picture_steps,
        "picture_sources": len(pictures.sources) if pictures is not None else 0,
        "tokens_per_s": tokens_seen / max(time.perf_counter() - t_mark, 1e-9),
        "parameters": sum(p.numel() for p in model.parameters()),
        "trained_parameters": sum(p.numel() for p in trained),
    }
    model.eval()
    meta_out = {"trained": "sft", "format": mode, **config, "commands": commands}
    save_model(model, tok, cfg.out, meta_out, pixels)
    write_card(cfg.out, {
        "title": f"SSR {mode}-SFT of {cfg.init}", "command": meta["command"],
        "description": f"A Qwen3-VL-architecture model trained by `ssr-server train sft` on the oracle "
                       f"trajectories ({mode} form) of the world in {cfg.world}.",
        **figures, **{f"config.{k}": v for k, v in config.items()}})
    return figures

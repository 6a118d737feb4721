"""``ssr-lab train probe``: does a model read its pictures? Teacher-forced, in seconds, no agent loop.

Success on visual and detail questions mixes three things: choosing the move, the zoom box, and reading.
This probe isolates the last two. It draws reading drills (``picture_drills``: a split's visual/detail
trajectories with a freshly drawn picture and its new answer, and zoom box) and, teacher-forced, counts
the drills whose every predicted token (answer, and box for detail) is the argmax: once with each
drill's own picture(s), once with the picture(s) of the next drill of the same kind (same text, another
look). A model that reads scores higher with its own pictures; one that guesses from the text alone
scores the same on both (the ``rotated`` column is the text-only baseline, priors included).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ssr_lab.world.records import Question

KINDS = ("visual", "detail")


@dataclass
class ProbeSetup:
    """What both probes start from: the model in eval mode, its tokenizer, the prompt format, the reading
    drills of the chosen questions, and a collator for the model's pictures."""

    model: Any
    tok: Any
    fmt: Any
    drills: Any  # PictureDrills
    collate: Any  # Collator


def probe_setup(world: Path, model_dir: str, split: str, seed: int,
                choose: Callable[[list[Question]], list[Question]], zoom: str, threads: int | None = None,
                zoom_jitter: float = 0.0, zoom_edge_jitter: float = 0.0) -> ProbeSetup:
    """Load ``model_dir`` and make reading drills (``moves=False``) of the questions ``choose`` keeps from
    ``world``'s ``split``, their trajectories written at the ``zoom`` style."""
    from transformers import AutoImageProcessor

    from ssr_lab.train.data import Collator
    from ssr_lab.train.picture_drills import PictureDrills
    from ssr_lab.train.setup import load_model, oracle_examples, split_questions, zoom_styled
    from ssr_lab.world.build import world_entities
    from ssr_lab.world.records import load_questions
    from ssr_server.core.formats.format import get_format
    from ssr_server.core.library import LibraryRegistry

    if threads:
        torch.set_num_threads(threads)
    fmt = get_format()
    model, tok = load_model(model_dir)
    model.eval()
    split_qs = split_questions(load_questions(world / "questions.jsonl"), split, None, seed)
    questions = zoom_styled(choose(split_qs), zoom)
    if not questions:
        raise ValueError(f"no visual or detail question in split {split!r} of {world}")
    library = LibraryRegistry().get("default")
    examples, _ = asyncio.run(oracle_examples(world, questions, tok, fmt, library, "ssr", progress=False))
    drills = PictureDrills.of(examples, questions, world_entities(world), tok, fmt, moves=False, zoom=zoom,
                              zoom_jitter=zoom_jitter, zoom_edge_jitter=zoom_edge_jitter)
    processor = AutoImageProcessor.from_pretrained(model_dir, backend="pil")
    return ProbeSetup(model, tok, fmt, drills, Collator(model, processor, tok.pad_token_id or 0))


@dataclass
class ProbeConfig:
    world: Path
    model: str
    split: str = "test"
    questions: int = 400  # at most this many visual/detail questions of the split (the drill sources)
    drills: int = 128
    batch_size: int = 16
    seed: int = 12345
    threads: int | None = None
    zoom: str = "tight"  # the zoom box detail drills write and crop at (the style the model was trained in)


def _exact(model: Any, collate: Any, batch: list[Any]) -> tuple[list[bool], float]:
    """Per drill: every predicted token right (argmax); and the batch's mean cross-entropy."""
    from ssr_lab.train.data import token_logits

    with torch.no_grad():
        c = collate(batch)
        logits = token_logits(model, c)  # (N, vocab): every predicted token of the batch
        right = logits.argmax(-1) == c.targets
        per = [bool(right[c.rows == r].all()) for r in range(len(batch))]
        return per, float(torch.nn.functional.cross_entropy(logits, c.targets))


def run_probe(cfg: ProbeConfig) -> dict[str, Any]:
    """Per kind: drills, exact-answer rate and cross-entropy with own pictures and with rotated ones."""
    from ssr_lab.train.data import Example

    setup = probe_setup(cfg.world, cfg.model, cfg.split, cfg.seed,
                        lambda qs: [q for q in qs if q.kind in KINDS][: cfg.questions], cfg.zoom, cfg.threads)
    model, collate, drills = setup.model, setup.collate, setup.drills
    if not drills.sources:
        raise ValueError("no reading drill could be made from the split's trajectories")
    drawn = drills.draw(cfg.drills, random.Random(cfg.seed))
    kinds: dict[str, Any] = {}
    for kind in KINDS:
        own = [d for d in drawn if d.kind == kind]
        if len(own) < 2:
            continue
        rotated = [Example(d.key, d.kind, d.ids, d.mask, own[(i + 1) % len(own)].images)
                   for i, d in enumerate(own)]
        row: dict[str, Any] = {"drills": len(own)}
        for name, batch_of in (("own", own), ("rotated", rotated)):
            exact: list[bool] = []
            losses = []
            for i in range(0, len(batch_of), cfg.batch_size):
                per, loss = _exact(model, collate, batch_of[i : i + cfg.batch_size])
                exact += per
                losses.append(loss)
            row[name] = {"exact": sum(exact) / len(exact), "cross_entropy": sum(losses) / len(losses)}
        kinds[kind] = row
    return {"model": cfg.model, "split": cfg.split, "drills": len(drawn), "seed": cfg.seed, "kinds": kinds}


def format_probe(r: dict[str, Any]) -> str:
    lines = [f"reading probe: {r['model']}, {r['drills']} drills from the {r['split']} split "
             f"(seed {r['seed']})",
             f"{'kind':<8} {'drills':>6}  {'exact, own pictures':>19}  {'rotated':>8}  {'CE own':>7}  "
             f"{'rotated':>7}"]
    for kind, row in r["kinds"].items():
        own, rot = row["own"], row["rotated"]
        lines.append(f"{kind:<8} {row['drills']:>6}  {own['exact']:>19.1%}  {rot['exact']:>8.1%}"
                     f"  {own['cross_entropy']:>7.3f}  {rot['cross_entropy']:>7.3f}")
    lines.append("exact: every answer (and zoom box) token the argmax, teacher-forced; rotated: the same "
                 "drills with another drill's picture (text only)")
    return "\n".join(lines)

"""``ssr-lab train vision``: the vision tower trained on freshly drawn pictures, labels from their looks.

Our tiny models' vision towers start from scratch, and through the language model they hardly learn: a
shipped model read colours, counts and characters at chance (a teacher-forced probe on fresh test
pictures: 9-14% over ~4,000 picture drills of SFT, `picture_drills.py`), and its tower's output had
grown to norm ~700 per token against ~1 for the text embeddings. Here the tower gets a direct signal:
one small attention-pooling head per thing the world's questions read (colour, count, the big sign's
shape or character from the question picture; the small plaque's character from the zoom tool's crop),
cross-entropy on pictures drawn exactly as the world draws question images, a new random look for every
one (so nothing can be remembered). Two optional heads (``count_mean``, ``known``): the count read off
the MEAN of the tokens (one attention-pooled token did not count: 18% on six counts, chance 17%; a mean
counts what each token marks, and a language model's attention can take such a mean), and which of the
world's well-known entities the picture shows, if any (the first move of a knowledge question rests on
recognising them; a share of the pictures are those looks, in fresh views). ``sign_crop`` and
``count_crop``: the big sign's shape or character, and the count, read from the zoom tool's crop around
the sign and around the motif (what ``train sft``'s ``zoom_sign`` and ``zoom_count`` train the language
model to read, ``look_zoom.py``). Two more (``plaque_x``,
``plaque_y``): the tenth of the picture, across and down, where the plaque's centre lies, read off the
attention-pooled tokens, so only if a token's content says where it is (the zoom box a detail question
needs: a trained model wrote one left-right position for every picture; the tiny model's rotary
positions turn by only 0.15 radian from one column of image tokens to the next, 0.38 from one row to
the next). The heads are thrown away;
the language model is not touched.
``reinit`` starts the tower (patch embedding, blocks, mergers) afresh. SFT with picture drills then
teaches the language model to read the new features.
"""

from __future__ import annotations

import copy
import json
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from ssr_lab.train.checkpoint import reproduce, write_card
from ssr_lab.train.config.vision import VisionConfig
from ssr_lab.train.grow import grow_tower
from ssr_lab.train.schedule import cosine_lr
from ssr_lab.train.setup import load_model
from ssr_lab.train.vision_heads import CROP_HEADS, EXTRA, KNOWN_LOOKS, LABELS, PLACES, SIGNS, place
from ssr_lab.train.zoom_targets import crop_of, draw_view
from ssr_lab.world.categories import MOTIFS
from ssr_lab.world.entities import draw_look
from ssr_server.core.progress import progress_bar
from ssr_server.engine.tiny import read_pixels, save_model, write_processor_config

# The head tables and the config live beside this module; named here too for the code that imports them
# from it.
__all__ = ["CROP_HEADS", "EXTRA", "KNOWN_LOOKS", "LABELS", "PLACES", "SIGNS", "Pictures", "PoolHead",
           "TowerTrainer", "VisionConfig", "crop_targets", "draw_pictures", "evaluate", "place",
           "reinit_tower", "train_vision"]


@dataclass(frozen=True)
class Pictures:
    views: list[Image.Image]  # question images
    crops: list[Image.Image]  # the zoom tool's crop around each view's plaque
    zoomed: dict[str, list[Image.Image]]  # per other zoom target asked for ("sign", "motif"): its crops
    labels: dict[str, torch.Tensor]  # per head: (B,) class indices


def draw_pictures(n: int, rng: random.Random, known_share: float = 0.0, zoom: str = "tight",
                  jitter: float = 0.0, targets: Sequence[str] = (), edge_jitter: float = 0.0) -> Pictures:
    """``n`` pictures of random looks of random motifs (a ``known_share`` of them the looks of well-known
    entities), as question views, with their zoom crops in the ``zoom`` style (moved sideways by up to
    ``jitter`` gold widths): around the plaque, and around each of the other zoom ``targets`` asked for."""
    views: list[Image.Image] = []
    crops: list[Image.Image] = []
    zoomed: dict[str, list[Image.Image]] = {t: [] for t in targets}
    labels: dict[str, list[int]] = {k: [] for k in (*LABELS, *EXTRA)}
    motifs, known = sorted(MOTIFS), sorted(KNOWN_LOOKS)
    while len(views) < n:
        which = "unknown"
        if known_share > 0 and rng.random() < known_share:  # no draw at 0: old commands see old pictures
            which = rng.choice(known)
        look = KNOWN_LOOKS[which] if which != "unknown" else draw_look(rng, rng.choice(motifs))
        picture, region, canvas = draw_view(look, rng)
        plaque = crop_of(picture, region, canvas, "plaque", rng, zoom, jitter, edge_jitter)
        others = {t: crop_of(picture, region, canvas, t, rng, zoom, jitter, edge_jitter) for t in targets}
        if plaque is None or None in others.values():  # fell outside this view (rare): draw another
            continue
        box, crop = plaque
        views.append(picture)
        crops.append(crop)
        for t, other in others.items():
            if other is not None:
                zoomed[t].append(other[1])
        for key, value in (("colour", look.colour), ("count", str(look.count)), ("sign", look.sign.value),
                           ("plaque", look.plaque), ("count_mean", str(look.count)), ("known", which),
                           ("plaque_x", place((box[0] + box[2]) / 2)),
                           ("plaque_y", place((box[1] + box[3]) / 2)), ("sign_crop", look.sign.value),
                           ("count_crop", str(look.count))):
            labels[key].append({**LABELS, **EXTRA}[key].index(value))
    return Pictures(views, crops, zoomed, {k: torch.tensor(v) for k, v in labels.items()})


def crop_targets(heads: Sequence[str]) -> tuple[str, ...]:
    """The zoom targets besides the plaque whose crops ``heads`` read."""
    return tuple(CROP_HEADS[h] for h in heads if h in CROP_HEADS and h != "plaque")


class PoolHead(torch.nn.Module):
    """Attention pooling over an image's tokens (one learned query; or a plain mean), then a linear
    classifier."""

    def __init__(self, dim: int, classes: int, mean: bool = False) -> None:
        super().__init__()
        self.query = torch.nn.Parameter(torch.randn(dim) * 0.02)
        self.norm = torch.nn.LayerNorm(dim)
        self.out = torch.nn.Linear(dim, classes)
        self.mean = mean

    def forward(self, feats: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # feats: (B, T, D) padded, mask: (B, T) True for real tokens
        f = self.norm(feats)
        scores = torch.zeros_like(f[..., 0]) if self.mean else f @ self.query  # (B, T)
        w = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=1)  # (B, T)
        pooled: torch.Tensor = self.out((w.unsqueeze(-1) * f).sum(1))  # (B, classes)
        return pooled


class TowerTrainer:
    """The tower and its heads; ``loss`` of a batch of pictures and per-head accuracies."""

    def __init__(self, model: Any, processor: Any, heads: Sequence[str] = tuple(LABELS),
                 anchor: float = 0.0, anchor_crops: float | None = None) -> None:
        self.tower = model.model.visual
        self.processor = processor
        self.anchor = anchor
        # ``anchor_crops`` weighs the crops' drift apart from the views': a crop style the language model
        # has never read has nothing worth keeping, while the views' tokens carry every move SFT taught
        self.anchor_crops = anchor_crops
        # a frozen copy: its tokens are what the language model has learnt to read
        self.frozen = (copy.deepcopy(self.tower).eval().requires_grad_(False)
                       if max(anchor, anchor_crops or 0.0) > 0 else None)
        dim = int(self.tower.merger.linear_fc2.out_features)
        classes = {**LABELS, **EXTRA}
        self.heads = torch.nn.ModuleDict({k: PoolHead(dim, len(classes[k]), mean=k == "count_mean")
                                          for k in heads})
        self.device = next(self.tower.parameters()).device

    def pixels(self, images: Sequence[Image.Image]) -> Any:
        """The processor's batch (pixel_values, image_grid_thw), made once for the tower and its anchor."""
        return self.processor(images=list(images), return_tensors="pt")

    def features(self, batch: Any, tower: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, D) the merged tokens the language model would read, padded, and their (B, T) mask."""
        tower = self.tower if tower is None else tower
        grid = batch["image_grid_thw"].to(self.device)
        out = tower(batch["pixel_values"].to(self.device), grid_thw=grid).pooler_output  # (sum T, D)
        merge = int(self.tower.spatial_merge_size) ** 2
        parts = torch.split(out, (grid.prod(-1) // merge).tolist())
        feats = torch.nn.utils.rnn.pad_sequence(list(parts), batch_first=True)
        lengths = torch.tensor([len(p) for p in parts], device=self.device)
        mask = torch.arange(feats.shape[1], device=self.device).unsqueeze(0) < lengths.unsqueeze(1)
        return feats, mask

    def loss(self, pics: Pictures) -> tuple[torch.Tensor, dict[str, float]]:
        images = {"views": pics.views, "crops": pics.crops, **pics.zoomed}
        # without an anchor a stream no head reads costs a tower pass for nothing (half a view-only step)
        read = {CROP_HEADS.get(k, "views") for k in self.heads}
        batches = {k: self.pixels(v) for k, v in images.items()
                   if v and (k in read or self.frozen is not None)}
        feats = {k: self.features(b) for k, b in batches.items()}
        total = torch.zeros((), device=self.device)
        accuracy = {}
        for key, head in self.heads.items():
            stream = CROP_HEADS.get(key, "views")
            if stream not in feats:
                raise ValueError(f"the {key} head needs pictures drawn with their {stream} crops")
            logits = head(*feats[stream])
            target = pics.labels[key].to(self.device)
            total = total + torch.nn.functional.cross_entropy(logits, target)
            accuracy[key] = float((logits.argmax(-1) == target).float().mean())
        if self.frozen is not None:
            zoomed = [k for k in batches if k != "views"]
            if self.anchor_crops is None:  # one drift over every stream
                drift = self.drift(list(batches.values()), list(feats.values()))
                total = total + self.anchor * drift
                accuracy["drift"] = float(drift.detach())
            else:
                for name, weight, keys in (("drift", self.anchor, ["views"]),
                                           ("drift_crops", self.anchor_crops, zoomed)):
                    drift = self.drift([batches[k] for k in keys], [feats[k] for k in keys])
                    total = total + weight * drift
                    accuracy[name] = float(drift.detach())
        return total, accuracy

    def drift(self, batches: Sequence[Any], now: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Squared distance of the tokens from the frozen tower's, relative to their squared norm."""
        with torch.no_grad():
            before = [self.features(b, self.frozen)[0] for b in batches]
        num = torch.stack([((f - b) ** 2).sum(-1)[m].sum() for (f, m), b in zip(now, before, strict=True)])
        den = torch.stack([(b**2).sum(-1)[m].sum() for (_, m), b in zip(now, before, strict=True)])
        return num.sum() / den.sum()


def reinit_tower(tower: torch.nn.Module, generator: torch.Generator) -> None:
    """Fresh weights as a new model has them: matrices N(0, 0.02), norms one, biases zero; except the
    deepstack mergers' output layers, which start at zero. The heads train the main merger's tokens only;
    the deepstack features are added to the language model's hidden states at image positions, and
    random ones (norms 41 and 125 against 16 for the trained tokens, measured) drowned what the language
    model could read. From zero, SFT grows them only as far as they help."""
    with torch.no_grad():
        for name, p in tower.named_parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.02)
            elif "norm" in name and name.endswith("weight"):
                p.fill_(1.0)
            else:
                p.zero_()
        for merger in getattr(tower, "deepstack_merger_list", []):
            merger.linear_fc2.weight.zero_()
            merger.linear_fc2.bias.zero_()


def train_vision(cfg: VisionConfig, progress: bool = True) -> dict[str, Any]:
    """Train ``cfg.init``'s vision tower, save the whole model to ``cfg.out`` and return the figures."""
    from transformers import AutoImageProcessor

    started = time.perf_counter()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    model, tok = load_model(cfg.init)
    pixels = (cfg.image_pixels, cfg.image_pixels) if cfg.image_pixels else read_pixels(cfg.init)
    if cfg.max_pixels:  # pictures under the cap (the question images) keep their size; wider crops grow
        pixels = (pixels[0], cfg.max_pixels)
    cfg.out.mkdir(parents=True, exist_ok=True)
    write_processor_config(cfg.out, pixels)  # trained at the size the result will see pictures at
    processor = AutoImageProcessor.from_pretrained(cfg.out, backend="pil")
    if cfg.grow:
        grow_tower(model, cfg.grow)
    trainer = TowerTrainer(model, processor, cfg.heads, cfg.anchor, cfg.anchor_crops)
    share = cfg.known_share if "known" in cfg.heads else 0.0
    if cfg.reinit:
        reinit_tower(trainer.tower, torch.Generator().manual_seed(cfg.seed))
    params = [*trainer.tower.parameters(), *trainer.heads.parameters()]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.98), weight_decay=cfg.weight_decay)
    rng = random.Random(cfg.seed)
    log_path = cfg.out / "train_log.jsonl"
    trainer.tower.train()
    targets = crop_targets(cfg.heads)
    bar = progress_bar(total=cfg.steps, desc="vision", unit="step", disable=not progress)
    ema: dict[str, float] = {}
    first_loss: float | None = None
    step = 0
    with log_path.open("w", encoding="utf-8") as log:
        while step < cfg.steps and (time.perf_counter() - started) / 60 <= cfg.max_minutes:
            for group in optimizer.param_groups:
                group["lr"] = cosine_lr(step, cfg.lr, cfg.warmup, cfg.steps, 0.1)
            pics = draw_pictures(cfg.batch_size, rng, share, cfg.zoom, cfg.zoom_jitter, targets,
                                 cfg.zoom_edge_jitter)
            loss, accuracy = trainer.loss(pics)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            step += 1
            first_loss = float(loss.detach()) if first_loss is None else first_loss
            ema = {k: 0.95 * ema.get(k, v) + 0.05 * v for k, v in accuracy.items()}
            bar.update(1)
            bar.set_postfix({k: f"{v:.2f}" for k, v in ema.items()}, refresh=False)
            if step % cfg.log_every == 0:
                log.write(json.dumps({"step": step, "loss": float(loss.detach()),
                                      "accuracy": {k: round(v, 4) for k, v in accuracy.items()}}) + "\n")
                log.flush()
    bar.close()
    trainer.tower.eval()
    held_out = evaluate(trainer, cfg.eval_pictures, random.Random(cfg.seed + 1_000_003), share, cfg.zoom,
                        cfg.zoom_jitter, edge_jitter=cfg.zoom_edge_jitter)
    config = {k: str(v) for k, v in asdict(cfg).items()}
    commands = reproduce(Path("."), cfg.init)
    figures = {"steps": step, "planned_steps": cfg.steps, "first_loss": first_loss,
               "minutes": (time.perf_counter() - started) / 60,
               **{f"accuracy.{k}": round(v, 4) for k, v in held_out.items()}}
    save_model(model, tok, cfg.out, {"trained": "vision", **config, "commands": commands}, pixels)
    write_card(cfg.out, {
        "title": f"Vision tower trained on drawn pictures (from {cfg.init})", "command": "\n".join(commands),
        "description": "The model of init with its vision tower trained by `ssr-lab train vision` "
                       f"(heads on {', '.join(cfg.heads)}; the heads are not kept). Accuracies are on "
                       f"{cfg.eval_pictures} fresh pictures.",
        **figures, **{f"config.{k}": v for k, v in config.items()}})
    return figures


@torch.no_grad()
def evaluate(trainer: TowerTrainer, n: int, rng: random.Random, known_share: float = 0.0,
             zoom: str = "tight", jitter: float = 0.0, batch: int = 64,
             edge_jitter: float = 0.0) -> dict[str, float]:
    """Per-head accuracy on ``n`` fresh pictures (crops as in training)."""
    correct: dict[str, float] = {k: 0.0 for k in trainer.heads}
    done = 0
    while done < n:
        k = min(batch, n - done)
        pics = draw_pictures(k, rng, known_share, zoom, jitter, crop_targets(list(trainer.heads)),
                             edge_jitter)
        _, accuracy = trainer.loss(pics)
        for key in correct:
            correct[key] += accuracy[key] * k
        done += k
    return {key: value / max(n, 1) for key, value in correct.items()}

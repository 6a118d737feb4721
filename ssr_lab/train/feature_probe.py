"""``ssr-lab train probe-features``: is what a picture question asks *in* the picture's tokens, and does it
reach the position where the answer is written?

``train probe`` says whether a model reads its pictures; this says where the reading is lost. Per asked
attribute (a visual question's colour, count, shape or character; a detail question's plaque, read off the
zoom crop), reading drills with freshly drawn pictures (``picture_drills``, as ``train probe``) are run
teacher-forced once, and four figures are cross-validated over them:

- ``majority``: the most frequent answer's share (what a constant guess gets);
- ``model``: the drills whose answer tokens are all the model's argmax;
- ``picture``: a probe on the tokens of the picture the answer is read from, as the language model receives
  them (the vision tower's output): a small MLP per token, four attention-pooling heads, a linear layer.
  Content-based pooling, what the language model's attention could do;
- ``answer``: a linear probe on the language model's last hidden state where it predicts the answer.

``picture`` near ``majority``: the tower does not deliver the attribute; ``picture`` well above ``model``:
it is there and the language model does not read it; ``answer`` above ``model``: it reaches the answer's
position and the output head does not turn it into the word.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ssr_lab.train.picture_drills import ASPECTS
from ssr_lab.world.records import Question

ATTRIBUTES: tuple[str, ...] = ASPECTS  # what a visual or detail question asks of its picture


@dataclass
class FeatureProbeConfig:
    world: Path
    model: str
    split: str = "test"
    attributes: tuple[str, ...] = ATTRIBUTES
    drills: int = 1000  # per attribute
    questions: int = 600  # at most this many visual / detail questions of the split (the drill sources)
    folds: int = 5
    steps: int = 1500  # optimizer steps of each fold's probe
    batch_size: int = 16
    seed: int = 12345
    threads: int | None = None
    zoom: str = "wide"  # the zoom style detail drills write and crop at (the style the model was trained in)
    zoom_jitter: float = 0.0  # detail crops moved sideways by up to this many gold widths (a model's boxes)
    zoom_edge_jitter: float = 0.0  # then each crop edge by up to this share of the gold box's size


@dataclass
class Features:
    labels: list[str]
    pictures: list[torch.Tensor]  # each (tokens, hidden): the answer's picture as the LM receives it
    answer: torch.Tensor  # (drills, hidden): the last layer's hidden state predicting the answer
    model_right: int


def _seeded(gen: torch.Generator, make: Any) -> Any:
    """``make()`` with its parameters initialised from ``gen``: a probe's figure must not depend on what
    the process drew before."""
    with torch.random.fork_rng():
        torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
        return make()


def _mlp_pool(hidden: int, classes: int) -> torch.nn.ModuleDict:
    token = torch.nn.Sequential(torch.nn.Linear(hidden, 64), torch.nn.GELU())
    return torch.nn.ModuleDict({"token": token, "pool": torch.nn.Linear(64, 4),
                                "out": torch.nn.Linear(64 * 4, classes)})


def _pooled(net: torch.nn.ModuleDict, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
    h = net["token"](x)  # (B, T, 64)
    weights = net["pool"](h).masked_fill(pad.unsqueeze(-1), float("-inf")).softmax(1)  # (B, T, 4)
    return net["out"](torch.einsum("bth,btk->bkh", h, weights).flatten(1))  # type: ignore[no-any-return]


def probe_accuracy(x: torch.Tensor, y: torch.Tensor, pad: torch.Tensor | None = None, *, folds: int = 5,
                   steps: int = 1500, seed: int = 0) -> float:
    """Cross-validated accuracy of a probe: attention-pooled over tokens when ``x`` is (N, T, H) (``pad``
    (N, T) marks padding), linear when ``x`` is (N, H). Features standardised on each fold's train part."""
    gen = torch.Generator().manual_seed(seed)
    n, classes = len(y), int(y.max()) + 1
    tokens = x.dim() == 3
    if tokens and pad is None:
        pad = torch.zeros(x.shape[:2], dtype=torch.bool)
    order = torch.randperm(n, generator=gen)
    right = 0
    for k in range(folds):
        test = order[k::folds]
        keep = torch.ones(n, dtype=torch.bool)
        keep[test] = False
        train = keep.nonzero().flatten()
        flat = x[train][~pad[train]] if tokens and pad is not None else x[train]
        mean, std = flat.mean(0), flat.std(0) + 1e-6
        z = (x - mean) / std
        net: torch.nn.Module = _seeded(gen, lambda: _mlp_pool(x.shape[-1], classes) if tokens
                                       else torch.nn.Linear(x.shape[-1], classes))
        opt = torch.optim.AdamW(net.parameters(), lr=3e-3, weight_decay=1e-2)

        def logits(idx: torch.Tensor, net: torch.nn.Module = net, z: torch.Tensor = z) -> torch.Tensor:
            if tokens and pad is not None:
                return _pooled(net, z[idx], pad[idx])  # type: ignore[arg-type]
            return net(z[idx])  # type: ignore[no-any-return]

        for _ in range(steps):
            idx = train[torch.randint(len(train), (min(64, len(train)),), generator=gen)]
            loss = torch.nn.functional.cross_entropy(logits(idx), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            right += int((logits(test).argmax(-1) == y[test]).sum())
    return right / n


def collect(model: Any, tok: Any, collate: Any, drills: list[Any], answer_open: list[int], n_close: int,
            batch_size: int) -> Features:
    """Run the drills teacher-forced; keep each one's answer label, its last picture's tokens and the
    hidden state that predicts the answer's first token."""
    from ssr_lab.train.data import forward_rest

    image_token, merge = int(model.config.image_token_id), collate.merge
    labels: list[str] = []
    pictures: list[torch.Tensor] = []
    answer: list[torch.Tensor] = []
    right = 0
    for i in range(0, len(drills), batch_size):
        batch = drills[i : i + batch_size]
        c = collate(batch)
        with torch.no_grad():
            out = forward_rest(model, c, hidden_states=True)
            embedded = out.hidden_states[0]  # (B, T, H): the pictures' tokens are the tower's output here
            correct = model.lm_head(out.last_hidden_state[c.rows, c.cols]).argmax(-1) == c.targets
        sizes = [int(g.prod()) // merge**2 for g in c.grid] if c.grid is not None else []
        first_image = 0
        for r, drill in enumerate(batch):
            sel = (c.rows == r).nonzero().flatten()
            targets = c.targets[sel].tolist()
            start = max(j for j in range(len(targets)) if targets[j : j + len(answer_open)] == answer_open)
            value = sel[start + len(answer_open) : len(sel) - n_close]
            labels.append(tok.decode(c.targets[value].tolist()).strip())
            answer.append(out.last_hidden_state[r, int(c.cols[value[0]])])
            right += bool(correct[value].all())
            positions = (c.ids[r] == image_token).nonzero().flatten()
            last = sizes[first_image + len(drill.images) - 1]  # the answer is read off the last picture
            pictures.append(embedded[r, positions[len(positions) - last :]])
            first_image += len(drill.images)
    return Features(labels, pictures, torch.stack(answer), right)


def run_feature_probe(cfg: FeatureProbeConfig) -> dict[str, Any]:
    from ssr_lab.train.reading_probe import probe_setup

    unknown = [a for a in cfg.attributes if a not in ATTRIBUTES]
    if unknown:
        raise ValueError(f"unknown attribute(s) {unknown}: choose from {', '.join(ATTRIBUTES)}")

    def choose(split: list[Question]) -> list[Question]:
        return ([q for q in split if q.kind == "visual"][: cfg.questions]
                + [q for q in split if q.kind == "detail"][: cfg.questions])

    setup = probe_setup(cfg.world, cfg.model, cfg.split, cfg.seed, choose, cfg.zoom, cfg.threads,
                        cfg.zoom_jitter, cfg.zoom_edge_jitter)
    model, tok, fmt, drills, collate = setup.model, setup.tok, setup.fmt, setup.drills, setup.collate
    answer_open = tok.encode(fmt.actions.answer.open, add_special_tokens=False)
    n_close = len(tok.encode(fmt.actions.answer.close, add_special_tokens=False))
    rng = random.Random(cfg.seed)
    rows: dict[str, Any] = {}
    for attribute in cfg.attributes:
        sources = [s for s in drills.sources if s.aspect == attribute and s.answer is not None]
        if not sources:
            continue
        drawn = [drills.drill(rng.choice(sources), rng) for _ in range(cfg.drills)]
        f = collect(model, tok, collate, drawn, answer_open, n_close, cfg.batch_size)
        classes = sorted(set(f.labels))
        y = torch.tensor([classes.index(a) for a in f.labels])
        width = max(p.shape[0] for p in f.pictures)
        pad = torch.tensor([[j >= p.shape[0] for j in range(width)] for p in f.pictures])
        pictures = torch.stack([torch.nn.functional.pad(p, (0, 0, 0, width - p.shape[0]))
                                for p in f.pictures])  # (drills, width, hidden)
        rows[attribute] = {
            "drills": len(y), "classes": len(classes),
            "majority": Counter(f.labels).most_common(1)[0][1] / len(y),
            "model": f.model_right / len(y),
            "picture": probe_accuracy(pictures.float(), y, pad, folds=cfg.folds, steps=cfg.steps,
                                      seed=cfg.seed),
            "answer": probe_accuracy(f.answer.float(), y, folds=cfg.folds, steps=cfg.steps, seed=cfg.seed),
        }
    if not rows:
        raise ValueError(f"no reading drill of {', '.join(cfg.attributes)} in split {cfg.split!r} of "
                         f"{cfg.world}")
    return {"model": cfg.model, "split": cfg.split, "folds": cfg.folds, "seed": cfg.seed,
            "zoom": cfg.zoom, "zoom_jitter": cfg.zoom_jitter, "zoom_edge_jitter": cfg.zoom_edge_jitter,
            "attributes": rows}


def format_feature_probe(r: dict[str, Any]) -> str:
    lines = [f"feature probe: {r['model']}, fresh pictures from the {r['split']} split's questions, "
             f"{r['folds']}-fold probes (seed {r['seed']}); detail crops {r['zoom']}, moved by up to "
             f"{r['zoom_jitter']} gold widths, edges by up to {r.get('zoom_edge_jitter', 0.0)} of its size",
             f"{'attribute':<10} {'drills':>6} {'classes':>7} {'majority':>9} {'model':>7} {'picture':>8} "
             f"{'answer':>7}"]
    for name, row in r["attributes"].items():
        lines.append(f"{name:<10} {row['drills']:>6} {row['classes']:>7} {row['majority']:>9.1%} "
                     f"{row['model']:>7.1%} {row['picture']:>8.1%} {row['answer']:>7.1%}")
    lines.append("model: the model's argmax; picture: an attention-pooled probe on the picture's tokens as "
                 "the language model receives them; answer: a linear probe where the answer is predicted")
    return "\n".join(lines)

"""``ssr-lab train soup``: a weighted average of the weights of models fine-tuned from one start.

Model soups (Wortsman et al., 2022): models fine-tuned from the same start sit in one basin, so the
average of their weights is itself a model, often better than each. Here it keeps what two SFT runs
learnt apart: R28 (the shipped model + one SFT run on crops with moved edges) read the plaque better
and lost held-out search phrasings; their soup with the shipped model kept search and most of the
reading (README, seventeenth session). The soup is written in the same Hugging Face layout (the first
model's config, tokenizer and image-processor config; the folders must agree on all of them), with a
model card whose commands are each parent's, once each in order, then the soup's.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ssr_lab.train.checkpoint import command_line, made_by, write_card

# files that must be identical across the soup's models: the same architecture, vocabulary and pictures
SAME_FILES = ("config.json", "tokenizer.json", "preprocessor_config.json")
KEEP_FILES = (*SAME_FILES, "tokenizer_config.json", "generation_config.json", "chat_template.jinja",
              "special_tokens_map.json")


class SoupError(ValueError):
    """The models cannot be averaged (different architectures, vocabularies or weight names)."""


def soup_weights(weights: Sequence[float] | None, n: int) -> list[float]:
    """The mixing weights, summing to one (uniform when None)."""
    if n < 2:
        raise SoupError("a soup needs at least two models")
    w = [1.0] * n if weights is None else [float(x) for x in weights]
    if len(w) != n:
        raise SoupError(f"{len(w)} weights for {n} models")
    if any(x < 0 for x in w) or sum(w) <= 0:
        raise SoupError("weights must be non-negative with a positive sum")
    return [x / sum(w) for x in w]


def _shards(folder: Path) -> list[str]:
    names = sorted(p.name for p in folder.glob("*.safetensors"))
    if not names:
        raise SoupError(f"{folder} holds no .safetensors weights")
    return names


def soup(models: Sequence[Path], out: Path, weights: Sequence[float] | None = None) -> dict[str, Any]:
    """Write the weighted average of ``models`` to ``out``; returns what the card records."""
    from safetensors.torch import load_file, save_file

    mix = soup_weights(weights, len(models))
    first = models[0]
    for m in models:
        if not (m / "config.json").is_file():
            raise SoupError(f"{m} is not a model folder (no config.json)")
    shards = _shards(first)
    for m in models[1:]:
        for name in SAME_FILES:
            a, b = first / name, m / name
            if a.is_file() != b.is_file() or (a.is_file() and a.read_bytes() != b.read_bytes()):
                raise SoupError(f"{m} and {first} differ in {name}: only models of one architecture, "
                                "vocabulary and picture size can be averaged")
        if _shards(m) != shards:
            raise SoupError(f"{m} and {first} store their weights in different files")
    if out.resolve() in {m.resolve() for m in models}:
        raise SoupError("--out must be a new folder, not one of the models")
    averaged: dict[str, dict[str, torch.Tensor]] = {}
    for name in shards:
        base = load_file(str(first / name))
        # a running float32 sum whatever the stored dtype (one model's shard in memory beside it), stored
        # at the end as the first model stores it
        total = {k: mix[0] * v.float() for k, v in base.items()}
        for m, w in zip(models[1:], mix[1:], strict=True):
            state = load_file(str(m / name))
            if set(state) != set(base) or any(state[k].shape != base[k].shape for k in base):
                raise SoupError(f"{m}/{name} has other weight names or shapes than {first}/{name}")
            for k, v in state.items():
                total[k] += w * v.float()
        averaged[name] = {k: total[k].to(base[k].dtype) for k in sorted(total)}
    out.mkdir(parents=True, exist_ok=True)
    for name in KEEP_FILES:
        if (first / name).is_file():
            shutil.copyfile(first / name, out / name)
    if (first / "model.safetensors.index.json").is_file():
        shutil.copyfile(first / "model.safetensors.index.json", out / "model.safetensors.index.json")
    for name, state in averaged.items():
        save_file(state, str(out / name), metadata={"format": "pt"})
    commands: list[str] = []
    for m in models:  # each parent's chain, a command shared by two lineages listed once
        commands += [c for c in made_by(m) or [] if c not in commands]
    commands.append(command_line())
    parents = [str(m) for m in models]
    (out / "ssr_tiny.json").write_text(json.dumps({"trained": "soup", "models": parents, "weights": mix,
                                                   "commands": commands}, indent=1))
    figures: dict[str, Any] = {"models": parents, "weights": [round(w, 6) for w in mix],
                               "tensors": sum(len(s) for s in averaged.values())}
    write_card(out, {"title": f"Weight soup of {', '.join(parents)}", "command": "\n".join(commands),
                     "description": "The weighted average of the weights of models fine-tuned from one start "
                                    "(`ssr-lab train soup`); config, tokenizer and image-processor config "
                                    f"are {first}'s, the same in every model.", **figures})
    return figures

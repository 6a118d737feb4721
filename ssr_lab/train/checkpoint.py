"""Checkpoints in the Hugging Face layout (loadable by transformers, our engine and SGLang), resumable,
and a model card holding the exact command that made the model.

``OUT/`` is the final model; ``OUT/checkpoints/step-N/`` are resumable states: the model (same layout),
``trainer.pt`` (optimizer, step, random states) and ``state.json``. A run started again with the same
arguments continues from the latest one.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ssr_server.engine.tiny import DEFAULT_PIXELS, Pixels, save_model


def command_line() -> str:
    """The command that is running, as a user would type it again (``python -m ssr_lab.cli`` as the
    ``ssr-lab`` it is: the trainers run only from the lab's CLI)."""
    import shlex

    prog = Path(sys.argv[0]).name
    return " ".join(["ssr-lab" if prog in ("ssr-lab", "__main__.py") else prog,
                     *(shlex.quote(a) for a in sys.argv[1:])])


def made_by(model_dir: str | Path) -> list[str] | None:
    """The commands that made a model folder, as its ``ssr_tiny.json`` keeps them (None: no such file)."""
    made = Path(model_dir) / "ssr_tiny.json"
    return [str(c) for c in json.loads(made.read_text()).get("commands", [])] if made.is_file() else None


def reproduce(world: Path, init: str | Path) -> list[str]:
    """Every command that made the model being trained, in order: the world's build (or the commands of
    the model it starts from, kept in that model's ``ssr_tiny.json``), then the running one."""
    prior = made_by(init)
    if prior is None:
        manifest = world / "manifest.json"
        info = json.loads(manifest.read_text()) if manifest.is_file() else {}
        prior = [f"ssr-lab world build {world} --entities {info['entities']} --seed {info['seed']}"] \
            if "entities" in info and "seed" in info else []
    return [*prior, command_line()]


def save_checkpoint(out: Path, model: Any, tok: Any, optimizer: torch.optim.Optimizer, step: int,
                    meta: dict[str, Any], keep: int = 2, pixels: Pixels = DEFAULT_PIXELS) -> Path:
    folder = out / "checkpoints" / f"step-{step:06d}"
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_model(model, tok, tmp, {**meta, "step": step}, pixels)
    torch.save({"optimizer": optimizer.state_dict(), "step": step, "torch_rng": torch.get_rng_state(),
                "python_rng": random.getstate(), "numpy_rng": np.random.get_state()}, tmp / "trainer.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step, **meta}, indent=1, default=str))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)  # a crash never leaves a half checkpoint under the final name
    for old in sorted((out / "checkpoints").glob("step-*"))[:-keep]:
        if old.suffix != ".tmp":
            shutil.rmtree(old, ignore_errors=True)
    return folder


def latest_checkpoint(out: Path) -> Path | None:
    done = [p for p in sorted((out / "checkpoints").glob("step-*")) if (p / "trainer.pt").is_file()]
    return done[-1] if done else None


def resume(folder: Path, model: Any, optimizer: torch.optim.Optimizer) -> int:
    """Load a checkpoint's weights, optimizer and random states; returns its step."""
    from safetensors.torch import load_file

    model.load_state_dict(load_file(str(folder / "model.safetensors")), strict=False)
    state = torch.load(folder / "trainer.pt", weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    np.random.set_state(state["numpy_rng"])
    return int(state["step"])


def write_card(out: Path, meta: dict[str, Any]) -> None:
    """``README.md``: what the model is, the exact command, the data and the training figures."""
    lines = [
        f"# {meta.get('title', 'ssr-server model')}", "",
        meta.get("description", ""), "",
        "## Reproduce", "", "```bash", meta["command"], "```", "",
        "## Training", "",
    ]
    lines += [f"- {k}: {v}" for k, v in meta.items() if k not in ("title", "description", "command", "eval")]
    if meta.get("eval"):
        lines += ["", "## Evaluation", "", "```", str(meta["eval"]), "```"]
    (out / "README.md").write_text("\n".join(lines) + "\n")

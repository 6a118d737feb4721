"""The models shipped in the package: the trained default (``serve`` and the demo without ``--model``).

``ssr-tiny/`` is a small Qwen3-VL-architecture model trained by ``ssr-lab train sft`` on our benchmark
world (its model card, ``ssr-tiny/README.md``, holds the exact command); it loads in transformers, in
the embedded engine and in SGLang like any Hugging Face checkpoint. ``tiny-random`` names the random
tiny model instead (built on first use), for tests and benchmarks of the machinery alone.
"""

from __future__ import annotations

from pathlib import Path

from ssr_server.core.errors import LibraryError

MODELS_DIR = Path(__file__).resolve().parent
DEFAULT_MODEL = "ssr-tiny"
RANDOM_MODEL = "tiny-random"


def default_model_dir() -> Path:
    path = MODELS_DIR / DEFAULT_MODEL
    if not (path / "model.safetensors").is_file():
        raise LibraryError(f"the shipped default model is missing from {path}; reinstall ssr-server, "
                           f"or pass --model DIR (or --model {RANDOM_MODEL} for the random tiny model)")
    return path

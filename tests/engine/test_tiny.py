"""The offline tiny Qwen3-VL: deterministic builds, Auto-class loading with no hub, the real Qwen ids."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from ssr_server.engine.tiny import SPECIAL_TOKENS, build_tiny_model, ensure_tiny_model

ARTIFACTS = ("model.safetensors", "tokenizer.json", "config.json")

# Loads a model directory with the Auto classes in a fresh interpreter under HF_HUB_OFFLINE=1 (the
# variable is read when huggingface_hub is imported, so it cannot be switched on in this process).
_OFFLINE_PROBE = textwrap.dedent("""
    import json, sys
    import torch
    from PIL import Image
    from transformers import (AutoConfig, AutoImageProcessor, AutoModelForImageTextToText,
                              AutoTokenizer)
    from huggingface_hub import constants
    out = {"offline": bool(constants.HF_HUB_OFFLINE)}
    for path in sys.argv[1:]:
        config = AutoConfig.from_pretrained(path)
        model = AutoModelForImageTextToText.from_pretrained(path).eval()
        tok = AutoTokenizer.from_pretrained(path)
        proc = AutoImageProcessor.from_pretrained(path, backend="pil")
        px = proc(images=[Image.new("RGB", (224, 160), (10, 200, 30))], return_tensors="pt")
        text = tok.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}],
            tokenize=False, add_generation_prompt=True)
        n = int(px["image_grid_thw"].prod()) // 4
        ids = tok.encode(text.replace("<|image_pad|>", "<|image_pad|>" * n))
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids]), pixel_values=px["pixel_values"],
                           image_grid_thw=px["image_grid_thw"],
                           mm_token_type_ids=(torch.tensor([ids]) == config.image_token_id).int()).logits
        out[path] = {
            "class": type(model).__name__,
            "vocab_size": config.text_config.vocab_size,
            "len_tok": len(tok),
            "ids": {k: getattr(config, k) for k in ("image_token_id", "video_token_id",
                                                    "vision_start_token_id", "vision_end_token_id")},
            "tok_ids": {t: tok.convert_tokens_to_ids(t) for t in
                        ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>",
                         "<|im_end|>", "<|endoftext|>")},
            "eos": tok.eos_token, "hello": tok.encode("Hello world"),
            "template": text, "grid": px["image_grid_thw"].tolist(),
            "logits_shape": list(logits.shape), "finite": bool(torch.isfinite(logits).all()),
        }
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real-vocabulary build (~8 s, mostly converting the 151,643 ranks): once per session."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen") / "model", seed=0, vocab="qwen")


@pytest.fixture(scope="module")
def offline(tiny_dir: Path, qwen_dir: Path) -> dict[str, Any]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", _OFFLINE_PROBE, str(tiny_dir), str(qwen_dir)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _bytes(d: Path) -> dict[str, bytes]:
    return {name: (d / name).read_bytes() for name in ARTIFACTS}


def test_same_seed_is_byte_identical(tiny_dir: Path, tmp_path: Path) -> None:
    again = build_tiny_model(tmp_path / "again", seed=0)
    assert _bytes(again) == _bytes(tiny_dir)


def test_different_seed_differs(tiny_dir: Path, tmp_path: Path) -> None:
    other = build_tiny_model(tmp_path / "other", seed=1)
    a, b = _bytes(tiny_dir), _bytes(other)
    assert a["model.safetensors"] != b["model.safetensors"]
    assert a["tokenizer.json"] == b["tokenizer.json"]  # the vocabulary does not depend on the seed
    assert json.loads((other / "ssr_tiny.json").read_text()) == {"seed": 1, "vocab": "trained"}


def test_ensure_builds_once(tmp_path: Path) -> None:
    path = ensure_tiny_model(tmp_path / "cache" / "tiny")
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_model(path) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tiny-")]  # no leftovers


@pytest.mark.parametrize("which", ["trained", "qwen"])
def test_loads_offline_with_auto_classes(which: str, offline: dict[str, Any], tiny_dir: Path,
                                         qwen_dir: Path) -> None:
    assert offline["offline"] is True
    info = offline[str(tiny_dir if which == "trained" else qwen_dir)]
    assert info["class"] == "Qwen3VLForConditionalGeneration"
    # the config's vision ids point at the tokenizer's own special tokens
    assert info["ids"]["image_token_id"] == info["tok_ids"]["<|image_pad|>"]
    assert info["ids"]["video_token_id"] == info["tok_ids"]["<|video_pad|>"]
    assert info["ids"]["vision_start_token_id"] == info["tok_ids"]["<|vision_start|>"]
    assert info["ids"]["vision_end_token_id"] == info["tok_ids"]["<|vision_end|>"]
    assert info["eos"] == "<|im_end|>"
    assert info["len_tok"] <= info["vocab_size"] and info["vocab_size"] % 64 == 0
    assert "<|vision_start|><|image_pad|><|vision_end|>Hi<|im_end|>" in info["template"]
    assert info["template"].endswith("<|im_start|>assistant\n")
    assert info["grid"] == [[1, 10, 14]]  # 224x160 -> 35 merged tokens
    assert info["logits_shape"][-1] == info["vocab_size"] and info["finite"]


def test_qwen_vocab_has_the_real_ids(offline: dict[str, Any], qwen_dir: Path) -> None:
    info = offline[str(qwen_dir)]
    assert info["hello"] == [9707, 1879]
    assert info["tok_ids"] == {"<|image_pad|>": 151655, "<|video_pad|>": 151656, "<|vision_start|>": 151652,
                               "<|vision_end|>": 151653, "<|im_end|>": 151645, "<|endoftext|>": 151643}
    assert info["vocab_size"] == 151680  # 151,643 ranks + 26 added tokens, padded to 64
    assert json.loads((qwen_dir / "ssr_tiny.json").read_text())["vocab"] == "qwen"


def test_trained_vocab_keeps_qwen_special_order(offline: dict[str, Any], tiny_dir: Path) -> None:
    ids = offline[str(tiny_dir)]["tok_ids"]
    base = ids["<|endoftext|>"]
    order = {t: base + i for i, t in enumerate(SPECIAL_TOKENS)}
    assert all(ids[t] == order[t] for t in ids)

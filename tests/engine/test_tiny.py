"""The offline tiny Qwen3-VL: deterministic builds, Auto-class loading with no hub, the real Qwen ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ssr_server.engine.tiny import SPECIAL_TOKENS, build_tiny_model, ensure_tiny_model

ARTIFACTS = ("model.safetensors", "tokenizer.json", "config.json")


@pytest.fixture(scope="module")
def offline(offline_probe: Any) -> dict[str, Any]:
    """What the background probe (started at session start, see conftest) found."""
    result: dict[str, Any] = offline_probe.result()
    return result


@pytest.fixture(scope="module")
def qwen_dir(offline_probe: Any, offline: dict[str, Any]) -> Path:
    """The real-vocabulary build the probe made (ready once its result is in)."""
    path: Path = offline_probe.qwen_dir
    return path


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


def test_the_picture_size_round_trips_through_the_processor_config(tmp_path: Path) -> None:
    from PIL import Image
    from transformers import AutoImageProcessor

    from ssr_server.engine.tiny import DEFAULT_PIXELS, read_pixels, write_processor_config

    assert read_pixels(tmp_path) == DEFAULT_PIXELS  # no config: what a fresh model gets
    write_processor_config(tmp_path, (448 * 320, 448 * 320))
    assert read_pixels(tmp_path) == (448 * 320, 448 * 320)
    grid = AutoImageProcessor.from_pretrained(tmp_path, backend="pil")(
        images=[Image.new("RGB", (224, 160))], return_tensors="pt")["image_grid_thw"]
    assert grid.tolist() == [[1, 20, 28]]  # 224x160 drawn at twice the side: 560 patches, 140 merged tokens
    with pytest.raises(ValueError, match="image pixels"):
        write_processor_config(tmp_path, (8192, 4096))

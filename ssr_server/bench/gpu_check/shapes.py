"""The embedded public shapes of Qwen3-VL-2B and 4B, as transformers configs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ssr_server.bench.gpu_check.common import (
    BOS_ID,
    EOS_ID,
    EXIT_FAILED,
    IMAGE_TOKEN_ID,
    VIDEO_TOKEN_ID,
    VISION_END_ID,
    VISION_START_ID,
    CheckError,
)

# ---------------------------------------------------------------------------------------------- shapes


@dataclass(frozen=True)
class Shape:
    """The shape of a Qwen3-VL checkpoint, as in its public ``config.json``."""

    name: str
    reference: str  # the public checkpoint this shape copies
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int = 128
    vocab_size: int = 151936
    tie_word_embeddings: bool = True
    rope_theta: float = 5_000_000.0
    mrope_section: tuple[int, int, int] = (24, 20, 20)  # sums to head_dim / 2
    max_position_embeddings: int = 262144
    vision_depth: int = 24
    vision_hidden_size: int = 1024
    vision_intermediate_size: int = 4096
    vision_heads: int = 16
    patch_size: int = 16
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    num_position_embeddings: int = 2304
    deepstack_visual_indexes: tuple[int, ...] = (5, 11, 17)

    def config_dict(self, dtype: str = "bfloat16") -> dict[str, Any]:
        """``config.json`` in the public checkpoints' form (legacy ``rope_scaling``/``rope_theta``, which
        every transformers and SGLang version that knows Qwen3-VL reads)."""
        return {
            "architectures": ["Qwen3VLForConditionalGeneration"],
            "model_type": "qwen3_vl",
            "dtype": dtype,
            "image_token_id": IMAGE_TOKEN_ID,
            "video_token_id": VIDEO_TOKEN_ID,
            "vision_start_token_id": VISION_START_ID,
            "vision_end_token_id": VISION_END_ID,
            "tie_word_embeddings": self.tie_word_embeddings,
            "text_config": {
                "model_type": "qwen3_vl_text",
                "attention_bias": False,
                "attention_dropout": 0.0,
                "bos_token_id": BOS_ID,
                "eos_token_id": EOS_ID,
                "dtype": dtype,
                "head_dim": self.head_dim,
                "hidden_act": "silu",
                "hidden_size": self.hidden_size,
                "initializer_range": 0.02,
                "intermediate_size": self.intermediate_size,
                "max_position_embeddings": self.max_position_embeddings,
                "num_attention_heads": self.num_attention_heads,
                "num_hidden_layers": self.num_hidden_layers,
                "num_key_value_heads": self.num_key_value_heads,
                "rms_norm_eps": 1e-6,
                "rope_scaling": {"mrope_interleaved": True, "mrope_section": list(self.mrope_section),
                                 "rope_type": "default"},
                "rope_theta": self.rope_theta,
                "tie_word_embeddings": self.tie_word_embeddings,
                "use_cache": True,
                "vocab_size": self.vocab_size,
            },
            "vision_config": {
                "model_type": "qwen3_vl",
                "deepstack_visual_indexes": list(self.deepstack_visual_indexes),
                "depth": self.vision_depth,
                "hidden_act": "gelu_pytorch_tanh",
                "hidden_size": self.vision_hidden_size,
                "in_channels": 3,
                "initializer_range": 0.02,
                "intermediate_size": self.vision_intermediate_size,
                "num_heads": self.vision_heads,
                "num_position_embeddings": self.num_position_embeddings,
                "out_hidden_size": self.hidden_size,
                "patch_size": self.patch_size,
                "spatial_merge_size": self.spatial_merge_size,
                "temporal_patch_size": self.temporal_patch_size,
            },
        }


SHAPES: dict[str, Shape] = {
    "2b": Shape(name="2b", reference="Qwen/Qwen3-VL-2B-Instruct", hidden_size=2048, intermediate_size=6144,
                num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8),
    "4b": Shape(name="4b", reference="Qwen/Qwen3-VL-4B-Instruct", hidden_size=2560, intermediate_size=9728,
                num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8),
}


# Tiny stand-ins of the two shapes for ``--dry-run``: the same code path on the CPU in seconds (real Qwen
# vocabulary, same image size, same contexts), only the widths and depths shrunk.
REHEARSAL_SHAPES: dict[str, Shape] = {
    "2b": Shape(name="2b", reference="tiny stand-in of Qwen3-VL-2B", hidden_size=64, intermediate_size=128,
                num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                mrope_section=(6, 5, 5), vision_depth=1, vision_hidden_size=32, vision_intermediate_size=64,
                vision_heads=1, deepstack_visual_indexes=(0,)),
    "4b": Shape(name="4b", reference="tiny stand-in of Qwen3-VL-4B", hidden_size=64, intermediate_size=192,
                num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                mrope_section=(4, 2, 2), vision_depth=2, vision_hidden_size=32, vision_intermediate_size=64,
                vision_heads=2, deepstack_visual_indexes=(0, 1)),
}


def get_shape(shape: str | Shape) -> Shape:
    if isinstance(shape, Shape):
        return shape
    key = shape.lower().removeprefix("qwen3-vl-")
    try:
        return SHAPES[key]
    except KeyError:
        raise CheckError(EXIT_FAILED, f"unknown shape {shape!r}; known: {', '.join(SHAPES)}") from None


def qwen3vl_config(shape: str | Shape, dtype: str = "bfloat16") -> Any:
    """The ``Qwen3VLConfig`` that transformers reads from the shape's ``config.json``."""
    from transformers import Qwen3VLConfig

    return Qwen3VLConfig.from_dict(get_shape(shape).config_dict(dtype))


def _meta_model(shape: str | Shape, torch_dtype: Any) -> Any:
    """The model on the meta device (no memory) in ``torch_dtype``."""
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    config = qwen3vl_config(shape, str(torch_dtype).replace("torch.", ""))
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch_dtype)
    try:
        with torch.device("meta"):
            return Qwen3VLForConditionalGeneration(config)
    finally:
        torch.set_default_dtype(previous)


def count_parameters(shape: str | Shape) -> int:
    """Parameters of the shape (tied embeddings counted once), from a meta-device model."""
    import torch

    model = _meta_model(shape, torch.bfloat16)
    return sum(p.numel() for p in model.parameters())

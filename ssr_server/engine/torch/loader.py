"""Load a model directory or hub id: weights, tokenizer and (for vision-language models) image processor."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from ssr_server.core.errors import EngineError
from ssr_server.engine.torch import segments
from ssr_server.engine.torch.config import EngineConfig
from ssr_server.engine.torch.fast_layers import install_fast_layers

log = logging.getLogger(__name__)

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
          "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}


@dataclass(frozen=True)
class LoadedModel:
    model: Any  # a transformers PreTrainedModel (VL: *ForConditionalGeneration, else *ForCausalLM)
    tokenizer: Any
    image_processor: Any | None
    is_vl: bool
    dtype: torch.dtype
    device: torch.device
    image_token_id: int | None
    merge_size: int
    eos_token_ids: frozenset[int]
    name: str

    @property
    def base(self) -> Any:
        """The decoder stack (with the vision tower for VL models) without the LM head."""
        return self.model.model

    @property
    def lm_head(self) -> Any:
        return self.model.get_output_embeddings()

    @property
    def text_config(self) -> Any:
        return self.model.config.get_text_config()

    @property
    def max_positions(self) -> int | None:
        """The model's context limit (``max_position_embeddings``), when it declares one."""
        n = getattr(self.text_config, "max_position_embeddings", None)
        return int(n) if n else None


def resolve_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise EngineError(f"unknown dtype {name!r}; use one of {sorted(DTYPES)}") from None


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config):
        eos = getattr(src, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, list | tuple):
            ids.update(int(e) for e in eos)
    for tok in ("<|im_end|>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id:
            ids.add(tid)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)


def attention_for(config: Any) -> str | dict[str, str]:
    """``attn_implementation`` for a model: the segmented attention for the text decoder, stock sdpa
    for everything else (the vision tower)."""
    name = segments.register()
    if hasattr(config, "vision_config"):
        return {"text_config": name, "vision_config": "sdpa"}
    return name


def load_model(path_or_id: str, config: EngineConfig | None = None) -> LoadedModel:
    """Load with the Auto classes; a vision-language config gets the image-text class and processor."""
    from transformers import (
        AutoConfig,
        AutoImageProcessor,
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoTokenizer,
    )

    cfg = config or EngineConfig()
    torch_dtype = resolve_dtype(cfg.dtype)
    device = torch.device(cfg.device)
    try:
        hf_config = AutoConfig.from_pretrained(path_or_id)
    except Exception as exc:
        raise EngineError(f"cannot load model config from {path_or_id!r}: {exc}") from exc
    is_vl = hasattr(hf_config, "vision_config")
    cls = AutoModelForImageTextToText if is_vl else AutoModelForCausalLM
    model: Any = cls.from_pretrained(path_or_id, dtype=torch_dtype,
                                     attn_implementation=attention_for(hf_config))
    model.to(device)
    model.eval()
    configure_bf16_matmul(model, torch_dtype, device, cfg.bf16_matmul, exact=cfg.exact)
    install_fast_layers(model)
    tokenizer = AutoTokenizer.from_pretrained(path_or_id)
    image_processor = None
    merge_size = 1
    image_token_id: int | None = None
    if is_vl:
        # The PIL backend needs no torchvision (PyPI's torchvision is a CUDA build that fails on CPU torch).
        image_processor = AutoImageProcessor.from_pretrained(path_or_id, backend="pil")
        merge_size = int(getattr(image_processor, "merge_size", 2))
        image_token_id = int(hf_config.image_token_id)
    return LoadedModel(
        model=model, tokenizer=tokenizer, image_processor=image_processor, is_vl=is_vl,
        dtype=torch_dtype, device=device, image_token_id=image_token_id,
        merge_size=merge_size, eos_token_ids=_eos_ids(model, tokenizer), name=path_or_id,
    )


def configure_bf16_matmul(model: Any, dtype: torch.dtype, device: torch.device, mode: str = "auto",
                          exact: bool = False) -> bool:
    """``auto``: on a CPU without bf16 arithmetic, multi-token bf16 matmuls use the fp32 kernel (but not
    for an ``exact`` engine: a draft row would then take another kernel than a one-token step); on
    one with it, the native kernel with weights packed once for oneDNN (see ``cpu_bf16``). ``native``:
    PyTorch's kernel as it is; ``fp32``: always the fp32 kernel (on CPU). True when either is installed."""
    from ssr_server.engine.torch.cpu_bf16 import (
        can_pack,
        has_native_bf16,
        install_fp32_matmul,
        install_packed_linear,
    )

    if mode not in ("auto", "native", "fp32"):
        raise EngineError(f"bf16_matmul must be auto, native or fp32, not {mode!r}")
    if dtype != torch.bfloat16 or device.type != "cpu" or mode == "native":
        return False
    if mode == "auto" and has_native_bf16():
        if not can_pack():
            return False
        n = install_packed_linear(model)
        log.info("bf16 on a CPU with bf16 arithmetic: %d linear layers multiply with oneDNN-packed "
                 "weights", n)
        return n > 0
    if mode == "auto" and exact:
        log.info("bf16 with exact drafts on a CPU without bf16 arithmetic: PyTorch's bf16 kernel at every "
                 "row count (multi-row products through the fp32 one would change kernels with the row "
                 "count, and drafts could change the text); fp32 or SSR_EXACT_DRAFTS=off are faster here")
        return False
    n = install_fp32_matmul(model)
    log.info("bf16 on a CPU without bf16 arithmetic: %d linear layers use the fp32 kernel for "
             "multi-token forwards", n)
    return True

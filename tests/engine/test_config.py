"""EngineConfig: built from the SSR_* settings, validated, and the only way to configure the engine;
the segmented attention is registered under its own name and used by the text decoder only."""

from __future__ import annotations

import pytest
import torch

from ssr_server.core.config import Settings
from ssr_server.core.errors import EngineError
from ssr_server.engine.torch import segments
from ssr_server.engine.torch.config import EngineConfig
from ssr_server.engine.torch.engine import TorchEngine
from ssr_server.engine.torch.loader import LoadedModel


def test_from_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in {"SSR_DEVICE": "cuda:1", "SSR_DTYPE": "bf16", "SSR_MAX_BATCHED_TOKENS": "4096",
                 "SSR_MAX_BATCHED_SEQS": "32", "SSR_PREFILL_CHUNK_TOKENS": "256",
                 "SSR_MAX_DECODE_SLOWDOWN": "2", "SSR_PREFIX_CACHE_MB": "64", "SSR_MAX_CONTEXT": "8192",
                 "SSR_TORCH_THREADS": "3", "SSR_BF16_MATMUL": "native", "SSR_MAX_HEAVY_DELAY": "0.5",
                 "SSR_SLICE_SELECTIONS": "true"}.items():
        monkeypatch.setenv(k, v)
    c = EngineConfig.from_settings(Settings())
    assert c == EngineConfig(device="cuda:1", dtype="bf16", max_num_batched_tokens=4096, max_num_seqs=32,
                             prefill_chunk_size=256, max_decode_slowdown=2.0, prefix_cache_bytes=64 << 20,
                             max_context=8192, threads=3, bf16_matmul="native", max_heavy_delay=0.5,
                             slice_selections=True)
    with pytest.raises(AttributeError):
        c.device = "cpu"  # type: ignore[misc]  # frozen


@pytest.mark.parametrize("bad", [
    {"dtype": "int8"}, {"bf16_matmul": "fast"}, {"max_num_batched_tokens": 0}, {"max_num_seqs": 0},
    {"prefill_chunk_size": 9000}, {"min_prefill_chunk": 600}, {"max_decode_slowdown": 1.0},
    {"max_heavy_delay": -1.0}, {"max_context": 1}, {"threads": 0},
])
def test_invalid_configs(bad: dict[str, object]) -> None:
    with pytest.raises(EngineError):
        EngineConfig(**bad)  # type: ignore[arg-type]


def test_a_loaded_model_must_match_the_config(lm: LoadedModel) -> None:
    with pytest.raises(EngineError, match="config says"):
        TorchEngine(lm, EngineConfig(dtype="bf16"), start=False)


def test_attention_is_registered_by_name_not_patched(lm: LoadedModel) -> None:
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    assert AttentionInterface._global_mapping["sdpa"] is sdpa_attention_forward  # untouched
    assert segments.ATTENTION in AttentionInterface._global_mapping
    config = lm.model.config
    assert config.text_config._attn_implementation == segments.ATTENTION
    assert config.vision_config._attn_implementation == "sdpa"  # the vision tower: stock attention
    assert lm.model.model.visual.config._attn_implementation == "sdpa"
    assert torch.device("cpu") == lm.device


def test_exact_drafts_are_on_where_reduced_precision_meets_drafts() -> None:
    assert not EngineConfig().exact  # fp32: drafts' kernels have not changed a turn
    assert EngineConfig(dtype="bf16").exact and EngineConfig(dtype="fp16").exact
    assert not EngineConfig(dtype="bf16", speculative_tokens=0).exact  # no drafts: nothing to match
    assert not EngineConfig(dtype="bf16", jump_forward=False, prompt_lookup=False).exact
    assert EngineConfig(dtype="bf16", speculative_tokens=0, exact_drafts="on").exact
    assert not EngineConfig(dtype="bf16", exact_drafts="off").exact
    assert EngineConfig(exact_drafts="on").exact
    with pytest.raises(EngineError, match="exact_drafts"):
        EngineConfig(exact_drafts="sometimes")

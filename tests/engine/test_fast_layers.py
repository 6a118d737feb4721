"""Decoder layers without nn.Module call overhead (engine/torch/fast_layers.py): the same logits, bit for
bit, as transformers' own layers, through the engine's packed forward (prefill, then decode steps and
a drafted chunk), in fp32 and in bf16 (packed and fused projections where the CPU has bf16
arithmetic), for each listed layer class: Llama, Qwen3 and Qwen3-VL's text decoder."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ssr_server.core.protocol import Context
from ssr_server.engine.torch.config import EngineConfig
from ssr_server.engine.torch.fast_layers import use_fast_layers
from ssr_server.engine.torch.loader import LoadedModel, load_model
from ssr_server.engine.torch.prefix_cache import PrefixCache
from ssr_server.engine.torch.runner import Chunk, ModelRunner


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """A small random Llama (GQA: 4 query heads on 2 KV heads) with the tiny model's tokenizer."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True)
    out = tmp_path_factory.mktemp("llama") / "model"
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """A small random Qwen3 (per-head q/k norms; GQA) with the tiny model's tokenizer."""
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                      tie_word_embeddings=True)
    model = Qwen3ForCausalLM(cfg)
    with torch.no_grad():  # norms of ones would hide a skipped norm: give each its own weights
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    out = tmp_path_factory.mktemp("qwen3") / "model"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def model_dirs(llama_dir: Path, qwen3_dir: Path, tiny_model_dir: Path) -> dict[str, Path]:
    return {"llama": llama_dir, "qwen3": qwen3_dir, "qwen3_vl": tiny_model_dir}


def _decode(lm: LoadedModel, steps: int = 6) -> list[torch.Tensor]:
    """The prompt's last logits, then each decode step's (fed the prompt's tokens again: a random
    model's greedy choice repeats one token), through the packed forward."""
    runner = ModelRunner(lm, PrefixCache(1 << 28))
    ids = list(lm.tokenizer.encode("The capital of France is a city on the river", add_special_tokens=False))
    p = runner.prepare(Context(tuple(ids)), reserve=steps + 1)
    runner.prefill([p], insert=False)
    kv, logits, pos = p.kv, p.last_logits, p.next_pos
    assert kv is not None and logits is not None
    out = [logits]
    dims = 3 if lm.is_vl else 1
    for _ in range(steps):
        chunk = Chunk(kv, [ids[len(out) % len(ids)]], torch.tensor([[pos]]).expand(dims, 1), [0],
                      past_len=kv.length)
        res = runner.forward([chunk])[0]
        if res.inplace:
            kv.length += 1
        else:
            kv.append(res.keys, res.values)
        logits, pos = res.logits[0], pos + 1
        out.append(logits)
    # a decode step with a draft: several rows attending to the past and to each other
    rows = ids[:5]
    chunk = Chunk(kv, rows, torch.arange(pos, pos + 5).expand(dims, 5), list(range(5)), past_len=kv.length)
    out.extend(runner.forward([chunk])[0].logits)
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3_vl"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_fast_layers_give_transformers_logits_bit_for_bit(model_dirs: dict[str, Path], arch: str,
                                                         dtype: str) -> None:
    lm = load_model(str(model_dirs[arch]), EngineConfig(dtype=dtype))
    layers = [m for m in lm.model.modules() if type(m).__name__.endswith("DecoderLayer")]
    assert lm.model.ssr_fast_layers == len(layers) > 0
    fast = _decode(lm)
    use_fast_layers(lm.model, False)
    assert not any("forward" in vars(m) for m in layers)  # transformers' own forward again
    stock = _decode(lm)
    use_fast_layers(lm.model, True)
    assert all(torch.equal(a, b) for a, b in zip(fast, stock, strict=True))
    assert not torch.equal(fast[-1], fast[-2])


def test_a_layer_that_is_not_exactly_llamas_keeps_its_forward(llama_dir: Path) -> None:
    from transformers.models.llama.modeling_llama import LlamaMLP

    from ssr_server.engine.torch.fast_layers import install_fast_layers

    class MyMLP(LlamaMLP):  # a replaced MLP may compute something else
        pass

    lm = load_model(str(llama_dir))
    layer = lm.model.model.layers[1]
    use_fast_layers(lm.model, False)
    layer.mlp.__class__ = MyMLP
    assert install_fast_layers(lm.model) == 2 and "forward" not in vars(layer)


def test_a_qwen3_layer_with_another_head_norm_keeps_its_forward(qwen3_dir: Path) -> None:
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    from ssr_server.engine.torch.fast_layers import install_fast_layers

    class MyNorm(Qwen3RMSNorm):  # a replaced query norm may compute something else
        pass

    lm = load_model(str(qwen3_dir))
    layer = lm.model.model.layers[2]
    use_fast_layers(lm.model, False)
    layer.self_attn.q_norm.__class__ = MyNorm
    assert install_fast_layers(lm.model) == 2 and "forward" not in vars(layer)

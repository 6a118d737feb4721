"""Decoder layers without nn.Module call overhead (engine/torch/fast_layers.py): the same logits, bit for
bit, as transformers' own layers, through the engine's packed forward (prefill, then decode steps),
in fp32 and in bf16 (packed and fused projections where the CPU has bf16 arithmetic)."""

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
    for _ in range(steps):
        chunk = Chunk(kv, [ids[len(out) % len(ids)]], torch.tensor([[pos]]), [0], past_len=kv.length)
        res = runner.forward([chunk])[0]
        if res.inplace:
            kv.length += 1
        else:
            kv.append(res.keys, res.values)
        logits, pos = res.logits[0], pos + 1
        out.append(logits)
    return out


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_fast_layers_give_transformers_logits_bit_for_bit(llama_dir: Path, dtype: str) -> None:
    lm = load_model(str(llama_dir), EngineConfig(dtype=dtype))
    assert lm.model.ssr_fast_layers == 3
    fast = _decode(lm)
    use_fast_layers(lm.model, False)
    assert "forward" not in vars(lm.model.model.layers[0])  # transformers' own forward again
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

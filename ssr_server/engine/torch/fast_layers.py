"""Decoder layers run without ``nn.Module`` call overhead, with transformers' own arithmetic.

A small model's decode step on a CPU is partly Python: each of a layer's ~15 module calls goes through
``nn.Module.__call__`` (hooks, forward pre/post checks) and transformers' wrappers (deprecated-argument
decorators, the kernels hub's forward switch), 30 layers over. For the decoder-layer classes listed
here, ``install_fast_layers`` gives each layer a forward that makes the very same tensor operations, in
the same order and dtypes, but calls its submodules' ``forward`` directly (the packed and fused
projections of ``cpu_bf16`` included). The results are the same bits (tests compare the logits of a
prefill and a greedy decode both ways); a SmolLM2-135M bf16 decode step takes ~2 ms less (of ~33,
measured). A layer class not listed keeps transformers' forward.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch


def _rms_norm(norm: Any, x: torch.Tensor) -> torch.Tensor:
    # transformers' LlamaRMSNorm.forward, op for op
    dtype = x.dtype
    x32 = x.to(torch.float32)
    variance = x32.pow(2).mean(-1, keepdim=True)
    x32 = x32 * torch.rsqrt(variance + norm.variance_epsilon)
    out: torch.Tensor = norm.weight * x32.to(dtype)
    return out


def _llama_layer(self: Any, hidden_states: torch.Tensor, attention_mask: Any = None, position_ids: Any = None,
                 cache: Any = None, use_cache: bool | None = False,
                 position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
                 past_key_values: Any = None, **kwargs: Any) -> torch.Tensor:
    """``LlamaDecoderLayer.forward`` (with ``LlamaAttention`` and ``LlamaMLP`` inlined)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.llama import modeling_llama as llama

    attn, mlp = self.self_attn, self.mlp
    cache = cache if cache is not None else past_key_values  # transformers < 5.19 names it so
    if position_embeddings is None:
        raise ValueError("the fast Llama layer needs the model's rotary position embeddings")
    residual = hidden_states
    h = _rms_norm(self.input_layernorm, hidden_states)
    input_shape = h.shape[:-1]
    shape = (*input_shape, -1, attn.head_dim)
    q = attn.q_proj.forward(h).view(shape).transpose(1, 2)
    k = attn.k_proj.forward(h).view(shape).transpose(1, 2)
    v = attn.v_proj.forward(h).view(shape).transpose(1, 2)
    cos, sin = position_embeddings
    q, k = llama.apply_rotary_pos_emb(q, k, cos, sin)
    if cache is not None:
        k, v = cache.update(k, v, attn.layer_idx)
    attention: Callable[..., tuple[torch.Tensor, Any]] = ALL_ATTENTION_FUNCTIONS.get_interface(
        attn.config._attn_implementation, llama.eager_attention_forward)
    dropout = 0.0 if not attn.training else attn.attention_dropout
    o, _ = attention(attn, q, k, v, attention_mask, dropout=dropout, scaling=attn.scaling,
                     position_ids=position_ids, use_cache=use_cache, **kwargs)
    o = attn.o_proj.forward(o.reshape(*input_shape, -1).contiguous())
    hidden_states = residual + o
    residual = hidden_states
    h = _rms_norm(self.post_attention_layernorm, hidden_states)
    h = mlp.down_proj.forward(mlp.act_fn(mlp.gate_proj.forward(h)) * mlp.up_proj.forward(h))
    out: torch.Tensor = residual + h
    return out


def _fast_forward(module: Any) -> Callable[..., torch.Tensor] | None:
    """The fast forward for ``module``, if it is exactly one of the listed layers (a subclass, or a
    replaced norm or MLP, may compute something else)."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaMLP, LlamaRMSNorm

    if type(module) is LlamaDecoderLayer and type(module.mlp) is LlamaMLP \
            and type(module.input_layernorm) is LlamaRMSNorm \
            and type(module.post_attention_layernorm) is LlamaRMSNorm:
        return _llama_layer
    return None


def install_fast_layers(model: Any) -> int:
    """Give every decoder layer of a listed class the fast forward; how many."""
    count = 0
    for module in model.modules():
        fwd = _fast_forward(module)
        if fwd is None:
            continue
        bound = types.MethodType(fwd, module)
        object.__setattr__(module, "ssr_fast_forward", bound)
        module.forward = bound
        count += 1
    model.ssr_fast_layers = count  # visible to benchmarks and logs
    return count


def use_fast_layers(model: Any, on: bool) -> None:
    """Fast forwards on, or transformers' own again: tests and benchmarks compare the two."""
    for module in model.modules():
        fwd = getattr(module, "ssr_fast_forward", None)
        if fwd is None:
            continue
        if on:
            module.forward = fwd
        else:
            module.__dict__.pop("forward", None)

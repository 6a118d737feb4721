"""Decoder layers run without ``nn.Module`` call overhead, with transformers' own arithmetic.

A small model's decode step on a CPU is partly Python: each of a layer's ~15 module calls goes through
``nn.Module.__call__`` (hooks, forward pre/post checks) and transformers' wrappers (deprecated-argument
decorators, the kernels hub's forward switch), 30 layers over. For the decoder-layer classes listed
here (Llama; Qwen3 and Qwen3-VL's text decoder, which add an RMSNorm over each head's queries and
keys), ``install_fast_layers`` gives each layer a forward that makes the very same tensor operations,
in the same order and dtypes, but calls its submodules' ``forward`` directly (the packed and fused
projections of ``cpu_bf16`` included). The results are the same bits (tests compare the logits of a
prefill and a greedy decode both ways); a SmolLM2-135M bf16 decode step takes ~2 ms less (of ~33,
measured). A layer class not listed keeps transformers' forward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama import modeling_llama as llama
from transformers.models.qwen3 import modeling_qwen3 as qwen3
from transformers.models.qwen3_vl import modeling_qwen3_vl as qwen3_vl

from ssr_server.engine.torch import forwards


def _rms_norm(norm: Any, x: torch.Tensor) -> torch.Tensor:
    # transformers' LlamaRMSNorm.forward, op for op
    dtype = x.dtype
    x32 = x.to(torch.float32)
    variance = x32.pow(2).mean(-1, keepdim=True)
    x32 = x32 * torch.rsqrt(variance + norm.variance_epsilon)
    out: torch.Tensor = norm._parameters["weight"] * x32.to(dtype)  # not nn.Module's slow __getattr__
    return out


class _Rotary:
    """``apply_rotary_pos_emb`` in fewer operations, with the same bits. transformers rotates half of
    the head with slices, a negation and a concatenation per call: ``rotate_half(x) = cat(-x2, x1)``.
    That is ``roll(x) * [-1.., 1..]``, and ``(-a) * b == a * (-b)`` exactly in floating point, so the
    sign goes into ``sin`` instead, once per forward (every layer gets the same ``sin``)."""

    def __init__(self) -> None:
        self._last: tuple[torch.Tensor, torch.Tensor] | None = None  # (sin, its signed copy)

    def signed(self, sin: torch.Tensor) -> torch.Tensor:
        last = self._last  # one read: another thread may replace it meanwhile
        if last is not None and last[0] is sin:
            return last[1]
        half = sin.shape[-1] // 2
        out = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1).unsqueeze(1)
        self._last = (sin, out)  # keeps ``sin`` alive: an identity test never meets a recycled id
        return out

    def __call__(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c, s = cos.unsqueeze(1), self.signed(sin)
        half = q.shape[-1] // 2
        return (q * c) + (q.roll(half, -1) * s), (k * c) + (k.roll(half, -1) * s)


_rotary = _Rotary()


def _layer(self: Any, hidden_states: torch.Tensor, attention_mask: Any = None, position_ids: Any = None,
           cache: Any = None, use_cache: bool | None = False,
           position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
           past_key_values: Any = None, **kwargs: Any) -> torch.Tensor:
    """``LlamaDecoderLayer.forward`` (with ``LlamaAttention`` and ``LlamaMLP`` inlined); with the per-head
    query and key norms (``q_norm``, ``k_norm``) when the layer has them, as Qwen3's do."""
    (attn, q_proj, k_proj, v_proj, o_proj, gate, up, down, act, norm1, norm2, q_norm, k_norm,
     attn_kwargs) = self.ssr_parts
    cache = cache if cache is not None else past_key_values  # transformers < 5.19 names it so
    if position_embeddings is None:
        raise ValueError("the fast decoder layer needs the model's rotary position embeddings")
    residual = hidden_states
    h = _rms_norm(norm1, hidden_states)
    input_shape = h.shape[:-1]
    shape = (*input_shape, -1, attn.head_dim)
    q = q_proj.forward(h).view(shape)
    k = k_proj.forward(h).view(shape)
    if q_norm is not None:
        q, k = _rms_norm(q_norm, q), _rms_norm(k_norm, k)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    v = v_proj.forward(h).view(shape).transpose(1, 2)
    q, k = _rotary(q, k, *position_embeddings)
    if cache is not None:
        k, v = cache.update(k, v, attn.layer_idx)
    attention = _attention_of(attn)
    dropout = 0.0 if not attn.training else attn.attention_dropout
    o, _ = attention(attn, q, k, v, attention_mask, dropout=dropout, scaling=attn.scaling,
                     position_ids=position_ids, use_cache=use_cache, **attn_kwargs, **kwargs)
    o = o_proj.forward(o.reshape(*input_shape, -1).contiguous())
    hidden_states = residual + o
    residual = hidden_states
    h = _rms_norm(norm2, hidden_states)
    h = down.forward(act(gate.forward(h)) * up.forward(h))
    out: torch.Tensor = residual + h
    return out


def _attention_of(attn: Any) -> Callable[..., tuple[torch.Tensor, Any]]:
    # looked up per call, as transformers does: the model's attention implementation may be changed
    fn: Callable[..., tuple[torch.Tensor, Any]] = ALL_ATTENTION_FUNCTIONS.get_interface(
        attn.config._attn_implementation, llama.eager_attention_forward)
    return fn


# the layer classes with a fast forward: (layer, its MLP, its RMSNorm, with per-head q/k norms)
_LISTED = (
    (llama.LlamaDecoderLayer, llama.LlamaMLP, llama.LlamaRMSNorm, False),
    (qwen3.Qwen3DecoderLayer, qwen3.Qwen3MLP, qwen3.Qwen3RMSNorm, True),
    (qwen3_vl.Qwen3VLTextDecoderLayer, qwen3_vl.Qwen3VLTextMLP, qwen3_vl.Qwen3VLTextRMSNorm, True),
)


def _parts(layer: Any, qk_norm: bool) -> tuple[Any, ...]:
    # submodules looked up once (nn.Module.__getattr__ is a slow path, ~520 lookups a step otherwise)
    a, m = layer.self_attn, layer.mlp
    # what the stock attention passes on to the attention function besides Llama's arguments
    extra = {"sliding_window": a.sliding_window} if hasattr(a, "sliding_window") else {}
    norms = (a.q_norm, a.k_norm) if qk_norm else (None, None)
    return (a, a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj, m.act_fn,
            layer.input_layernorm, layer.post_attention_layernorm, *norms, extra)


def _listed(module: Any) -> bool | None:
    """For exactly one of the listed layers (a subclass, or a replaced norm or MLP, may compute something
    else): whether it has per-head q/k norms; None otherwise."""
    for layer_cls, mlp_cls, norm_cls, qk_norm in _LISTED:
        if type(module) is not layer_cls:
            continue
        norms: list[Any] = [module.input_layernorm, module.post_attention_layernorm]
        if qk_norm:
            norms += [module.self_attn.q_norm, module.self_attn.k_norm]
        if type(module.mlp) is mlp_cls and all(type(n) is norm_cls for n in norms):
            return qk_norm
        return None
    return None


def install_fast_layers(model: Any) -> int:
    """Give every decoder layer of a listed class the fast forward; how many."""
    count = 0
    for module in model.modules():
        qk_norm = _listed(module)
        if qk_norm is None:
            continue
        object.__setattr__(module, "ssr_parts", _parts(module, qk_norm))
        forwards.install(module, "ssr_fast_forward", _layer)
        count += 1
    model.ssr_fast_layers = count  # visible to benchmarks and logs
    return count


def use_fast_layers(model: Any, on: bool) -> None:
    """Fast forwards on, or transformers' own again: tests and benchmarks compare the two."""
    forwards.switch(model, "ssr_fast_forward", on)

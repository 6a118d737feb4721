"""Segmented attention for the packed forward: each chunk attends to its own past only.

The packed forward puts the chunks of concurrent runs in ONE row so that the linear layers (where
batching pays) run once. Attention must not be done the same way: with a single row, every new token
would attend over the concatenation of *all* pasts through a dense ``(T, P_total + T)`` mask, the
pasts would be concatenated on every call, and transformers' ``repeat_kv`` would copy the whole packed
KV per layer (its GQA shortcut needs a single query token and no mask). For B runs with pasts of P
tokens a decode step then costs O(B * B * P): batching loses.

Here attention runs per *segment*, the consecutive chunks sharing one past: queries see that past
(a view of its ``SeqKV``, the new keys written in place when the past is exclusive and at its end) and
the segment's own new tokens (block-diagonal causal between its chunks; a chunk marked ``sees_first``
also sees the segment's first chunk: candidates scored in the forward that prefills the rest of their
context). Cost: O(sum t_i (P_i + t_i)).

The attention is registered with transformers' ``AttentionInterface`` under its own name
(``ATTENTION``, with sdpa's mask function under the same name) and models are loaded with it for their
text decoder only (``attn_implementation`` per sub-config; the vision tower keeps stock sdpa). While
``segments(...)`` is active on this thread, the text decoder's layers attend per segment; outside it
(the naive reference path, transformers' own ``generate``) the same layers get stock sdpa.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.cache_utils import DynamicCache, DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ssr_server.engine.torch import exact_attention
from ssr_server.engine.torch.exact_attention import one
from ssr_server.engine.torch.kv import SeqKV

ATTENTION = "ssr_segments"  # the attn_implementation name models are loaded with

_tls = threading.local()


@dataclass
class Segment:
    start: int  # offset of the segment's first new token in the packed row
    end: int
    past: SeqKV | None
    past_len: int
    bounds: list[tuple[int, int]] = field(default_factory=list)  # chunks, relative to start
    sees_first: list[bool] = field(default_factory=list)  # per chunk: also attends to the first chunk
    inplace: bool = False  # new keys written into the past's spare capacity (exclusive past at its end)
    closed: bool = False  # a tree draft's segment: no later chunk joins it
    mask: torch.Tensor | None = None  # (1, 1, t, past_len + t) additive; None: one token, no mask
    alone_from: int | None = None  # rows from here on are exact rows (``Chunk.alone_from``)
    exact_rows: int = 0  # its first rows are an exact engine's prefill rows (``Chunk.exact_rows``)
    memo: dict[Any, torch.Tensor] = field(default_factory=dict)  # exact rows' masks, across the layers


def plan(chunks: list[Any], dtype: torch.dtype, device: torch.device) -> list[Segment]:
    """Segments of ``chunks`` (runner ``Chunk``s): consecutive chunks on the same past share one. A
    tree draft's chunk (``branches``) has a segment of its own: its fed token, then each chain seeing
    it (as chunks that ``sees_first`` would)."""
    segs: list[Segment] = []
    uses: dict[int, int] = {}
    o = 0
    for c in chunks:
        t = len(c.ids)
        past = c.past if c.past is not None and c.past_len > 0 else None
        last = segs[-1] if segs else None
        tree = c.branches
        alone = c.alone_from
        if last is not None and past is not None and last.past is past and last.past_len == c.past_len \
                and not tree and not last.closed and alone is None and last.alone_from is None \
                and not c.exact_rows:
            last.bounds.append((o - last.start, o - last.start + t))
            last.sees_first.append(bool(c.sees_first))
            last.end = o + t
        else:
            segs.append(Segment(o, o + t, past, c.past_len if past is not None else 0, [(0, t)], [False],
                                exact_rows=c.exact_rows))
            if alone is not None and not tree:
                segs[-1].alone_from, segs[-1].closed = alone, True
            if tree:
                s, a = segs[-1], t - sum(tree)
                s.bounds, s.sees_first, s.closed = [(0, a)], [False], True
                for n in tree:
                    s.bounds.append((a, a + n))
                    s.sees_first.append(True)
                    a += n
            if past is not None:
                uses[id(past)] = uses.get(id(past), 0) + 1
        o += t
    for s in segs:
        if s.past is not None and uses[id(s.past)] == 1 and s.past_len == s.past.length:
            # decode steps grow geometrically; multi-token scratch (candidates) exactly
            s.past.reserve(s.end - s.start, exact=s.end - s.start > 1)
            s.inplace = True
        if s.alone_from is not None:  # the rows before it attend together, as the same rows alone would
            a = s.alone_from
            s.mask = _mask(dtype, device, s.past_len, [(0, a)]) if a > 0 and not s.exact_rows else None
        elif s.exact_rows < s.end - s.start:  # every segment but a lone exact prefill chunk (no mask)
            s.mask = _mask(dtype, device, s.past_len, s.bounds, s.sees_first)
    return segs


def _mask(dtype: torch.dtype, device: torch.device, past_len: int, bounds: list[tuple[int, int]],
          sees_first: list[bool] | None = None) -> torch.Tensor | None:
    t = bounds[-1][1]
    if t == 1:
        return None
    if len(bounds) > 1 and t > 128:  # a long prefill's rest and its candidates: per chunk is cheaper
        return _mask_per_chunk(dtype, device, past_len, bounds, sees_first)
    mask = torch.zeros((1, 1, t, past_len + t), dtype=dtype, device=device)
    if len(bounds) == 1:  # one chunk: causal
        blocked = torch.ones(t, t, dtype=torch.bool, device=device).triu(1)
    else:  # block-diagonal causal, plus the first chunk for the chunks that see it: a few whole-tensor ops
        # (a tree draft has a dozen one-token chunks: one op per chunk cost ~10 us each, 200 a step)
        chunk = torch.repeat_interleave(torch.arange(len(bounds), device=device),
                                        torch.tensor([b - a for a, b in bounds], device=device))
        row = torch.arange(t, device=device)
        seen = (chunk[:, None] == chunk[None, :]) & (row[None, :] <= row[:, None])
        if sees_first and any(sees_first[1:]):
            sees = torch.tensor([False, *sees_first[1:]], dtype=torch.bool, device=device)
            seen |= sees[chunk][:, None] & (chunk[None, :] == 0)
        blocked = ~seen
    mask[0, 0, :, past_len:].masked_fill_(blocked, torch.finfo(dtype).min)
    return mask


def _mask_per_chunk(dtype: torch.dtype, device: torch.device, past_len: int, bounds: list[tuple[int, int]],
                    sees_first: list[bool] | None) -> torch.Tensor:
    t = bounds[-1][1]
    mask = torch.full((1, 1, t, past_len + t), torch.finfo(dtype).min, dtype=dtype, device=device)
    mask[..., :past_len] = 0
    f0, f1 = bounds[0]
    for i, (a, b) in enumerate(bounds):
        tri = torch.ones(b - a, b - a, dtype=torch.bool, device=device).tril()
        mask[0, 0, a:b, past_len + a : past_len + b].masked_fill_(tri, 0)
        if sees_first and sees_first[i] and i > 0:
            mask[0, 0, a:b, past_len + f0 : past_len + f1] = 0
    return mask


class _Layer(DynamicLayer):
    """Hands the new keys/values straight to the attention (which finds the pasts itself)."""

    def __init__(self) -> None:
        super().__init__()
        self.new_k: torch.Tensor | None = None
        self.new_v: torch.Tensor | None = None

    def get_seq_length(self) -> int:
        return 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        self.is_initialized = True
        self.new_k, self.new_v = key_states, value_states
        return key_states, value_states


class SegmentCache(DynamicCache):
    def __init__(self, num_layers: int) -> None:
        super().__init__()
        self.layers = [_Layer() for _ in range(num_layers)]  # type: ignore[assignment]

    def new_kv(self, start: int, end: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-layer keys/values of the new tokens [start, end) of this forward (views)."""
        keys, values = [], []
        for layer in self.layers:
            assert isinstance(layer, _Layer) and layer.new_k is not None and layer.new_v is not None
            keys.append(layer.new_k[:, :, start:end])
            values.append(layer.new_v[:, :, start:end])
        return keys, values


def _attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: Any, dropout: float = 0.0, scaling: float | None = None,
               **kwargs: Any) -> tuple[torch.Tensor, None]:
    segs: list[Segment] | None = getattr(_tls, "segs", None)
    layer = getattr(module, "layer_idx", None)
    if segs is None or layer is None or id(module) not in _tls.modules:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    out = query.new_empty(query.shape)  # (1, heads, T, head_dim)
    for s in segs:
        k_new, v_new = key[:, :, s.start : s.end], value[:, :, s.start : s.end]
        if s.past is None:
            k, v = k_new, v_new
        elif s.inplace:
            n, t = s.past_len, s.end - s.start
            s.past.keys[layer][:, :, n : n + t] = k_new
            s.past.values[layer][:, :, n : n + t] = v_new
            k, v = s.past.keys[layer][:, :, : n + t], s.past.values[layer][:, :, : n + t]
        else:
            pk, pv = s.past.view(layer, s.past_len)
            k, v = torch.cat([pk, k_new], dim=2), torch.cat([pv, v_new], dim=2)
        q = query[:, :, s.start : s.end]
        heads, kv_heads = q.shape[1], k.shape[1]
        e, n = s.exact_rows, s.past_len
        if e:  # an exact engine's prefill rows: calls of one shape, wherever the prompt was cut
            out[:, :, s.start : s.start + e] = exact_attention.rows(q[:, :, :e], k, v, n, scaling, s.memo,
                                                                    fixed=True)
        if s.alone_from is not None:  # exact drafts: the prompt's rows as without a draft, then exact rows
            a = s.alone_from
            if a == 1 and not e:
                o1 = one(q[:, :, :1], k[:, :, : n + 1], v[:, :, : n + 1], scaling)
                out[:, :, s.start : s.start + 1] = o1
            elif a > 1 and not e:
                out[:, :, s.start : s.start + a] = torch.nn.functional.scaled_dot_product_attention(
                    q[:, :, :a], k[:, :, : n + a], v[:, :, : n + a], attn_mask=s.mask, scale=scaling,
                    enable_gqa=True)
            if s.end - s.start > a:
                out[:, :, s.start + a : s.end] = exact_attention.rows(q[:, :, a:], k, v, n + a, scaling,
                                                                      s.memo)
            continue
        if e:
            if s.end - s.start > e:  # the candidates that see the prefill rows (fused scoring)
                assert s.mask is not None  # internal invariant: ``plan`` gives them their mask
                out[:, :, s.start + e : s.end] = torch.nn.functional.scaled_dot_product_attention(
                    q[:, :, e:], k, v, attn_mask=s.mask[:, :, e:], scale=scaling, enable_gqa=True)
            continue
        if s.mask is None and s.end - s.start == 1 and heads % kv_heads == 0:
            o = one(q, k, v, scaling)
            if len(segs) == 1:  # one sequence's decode step: its output is the whole output
                return o.transpose(1, 2), None
            out[:, :, s.start : s.end] = o
            continue
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=s.mask, scale=scaling,
                                                             enable_gqa=True)
        if len(segs) == 1:  # one segment (a decode step with its draft, a prefill): no copy into ``out``
            return o.transpose(1, 2), None
        out[:, :, s.start : s.end] = o
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Register the segmented attention (and sdpa's mask function) under ``ATTENTION``; idempotent.
    Registration only adds a name: no other model in the process changes behaviour."""
    AttentionInterface.register(ATTENTION, _attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    return ATTENTION


def uses_segments(text_model: Any) -> bool:
    """Whether ``text_model`` (the text decoder) attends through ``ATTENTION``."""
    config = getattr(text_model, "config", None)
    return getattr(config, "_attn_implementation", None) == ATTENTION


@contextlib.contextmanager
def segments(text_model: Any, segs: list[Segment]) -> Iterator[None]:
    """While active on this thread, ``text_model``'s attention layers attend per segment."""
    if getattr(_tls, "owner", None) is not text_model:
        _tls.modules = {id(m) for m in text_model.modules() if hasattr(m, "layer_idx")}
        _tls.owner = text_model
    _tls.segs = segs
    try:
        yield
    finally:
        _tls.segs = None

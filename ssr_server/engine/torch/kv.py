"""Per-sequence KV buffers and the cache object handed to transformers for one packed forward.

``SeqKV`` keeps each layer's keys and values in a buffer with spare capacity, so appending a decoded
token writes in place instead of re-concatenating the whole history (transformers' DynamicLayer does a
``torch.cat`` of the full cache on every step).

``PackedCache`` is what one forward sees. With a single past it writes the new tokens straight into
that past's spare capacity (no copy of the history); with several pasts (work of concurrent runs
packed into one row) it concatenates them once and appends the new tokens after them. Either way the
new tokens' keys/values are recorded so the caller can keep the parts it needs.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


class SeqKV:
    """Keys/values of one token sequence: per layer ``(1, kv_heads, capacity, head_dim)``."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], length: int) -> None:
        self.keys = keys
        self.values = values
        self.length = length

    @classmethod
    def empty(cls, num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
              device: torch.device, capacity: int = 256) -> SeqKV:
        shape = (1, kv_heads, capacity, head_dim)
        return cls([torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)],
                   [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)], 0)

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    @property
    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() * 2 for k in self.keys)

    def reserve(self, extra: int) -> None:
        """Make room for ``extra`` more tokens (geometric growth keeps appends amortised O(1))."""
        need = self.length + extra
        if need <= self.capacity:
            return
        cap = max(need, self.capacity * 2)
        for layer in range(len(self.keys)):
            for buf in (self.keys, self.values):
                old = buf[layer]
                new = old.new_empty((old.shape[0], old.shape[1], cap, old.shape[3]))
                new[:, :, : self.length] = old[:, :, : self.length]
                buf[layer] = new

    def view(self, layer: int, length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.length if length is None else length
        return self.keys[layer][:, :, :n], self.values[layer][:, :, :n]

    def fork(self, length: int | None = None, extra: int = 64) -> SeqKV:
        """A private copy of the first ``length`` tokens with room for ``extra`` more."""
        n = self.length if length is None else length
        cap = n + max(extra, 16)
        keys, values = [], []
        for k, v in zip(self.keys, self.values, strict=True):
            nk = k.new_empty((k.shape[0], k.shape[1], cap, k.shape[3]))
            nv = v.new_empty((v.shape[0], v.shape[1], cap, v.shape[3]))
            nk[:, :, :n] = k[:, :, :n]
            nv[:, :, :n] = v[:, :, :n]
            keys.append(nk)
            values.append(nv)
        return SeqKV(keys, values, n)

    def append(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """Append per-layer ``(1, kv_heads, t, head_dim)`` chunks."""
        t = keys[0].shape[2]
        self.reserve(t)
        for layer, (k, v) in enumerate(zip(keys, values, strict=True)):
            self.keys[layer][:, :, self.length : self.length + t] = k
            self.values[layer][:, :, self.length : self.length + t] = v
        self.length += t


class _PackedLayer(DynamicLayer):
    def __init__(self, past_k: torch.Tensor | None, past_v: torch.Tensor | None,
                 inplace: tuple[SeqKV, int] | None) -> None:
        super().__init__()
        self._past_k, self._past_v = past_k, past_v
        self._inplace = inplace
        self.new_k: torch.Tensor | None = None
        self.new_v: torch.Tensor | None = None

    def get_seq_length(self) -> int:
        return 0 if self._past_k is None else int(self._past_k.shape[2])

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        self.is_initialized = True
        if self._inplace is not None:
            seq, layer = self._inplace
            n, t = seq.length, key_states.shape[2]
            seq.keys[layer][:, :, n : n + t] = key_states
            seq.values[layer][:, :, n : n + t] = value_states
            self.new_k = seq.keys[layer][:, :, n : n + t]
            self.new_v = seq.values[layer][:, :, n : n + t]
            return seq.keys[layer][:, :, : n + t], seq.values[layer][:, :, : n + t]
        self.new_k, self.new_v = key_states, value_states
        if self._past_k is None or self._past_v is None:
            return key_states, value_states
        return (torch.cat([self._past_k, key_states], dim=2),
                torch.cat([self._past_v, value_states], dim=2))


class PackedCache(DynamicCache):
    """The cache for one packed forward; see the module docstring."""

    def __init__(self, num_layers: int, pasts: list[tuple[SeqKV, int]], new_tokens: int) -> None:
        super().__init__()
        layers: list[_PackedLayer] = []
        single = len(pasts) == 1
        if single:
            # Scratch writes beyond the past's length: the past's own length is not changed, so what
            # it holds stays valid; the new tokens are read back from ``new_k``/``new_v``.
            seq, n = pasts[0]
            if n != seq.length:
                single = False
            else:
                seq.reserve(new_tokens)
        for layer in range(num_layers):
            if not pasts:
                layers.append(_PackedLayer(None, None, None))
            elif single:
                seq, n = pasts[0]
                k, v = seq.view(layer, n)
                layers.append(_PackedLayer(k, v, (seq, layer)))
            else:
                ks, vs = zip(*(s.view(layer, n) for s, n in pasts), strict=True)
                layers.append(_PackedLayer(torch.cat(ks, dim=2), torch.cat(vs, dim=2), None))
        self.layers = layers  # type: ignore[assignment]

    def new_kv(self, start: int, end: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-layer keys/values of the new tokens [start, end) of this forward (views)."""
        keys, values = [], []
        for layer in self.layers:
            assert isinstance(layer, _PackedLayer) and layer.new_k is not None and layer.new_v is not None
            keys.append(layer.new_k[:, :, start:end])
            values.append(layer.new_v[:, :, start:end])
        return keys, values

"""Per-sequence KV buffers.

``SeqKV`` keeps each layer's keys and values in a buffer with spare capacity, so appending a decoded
token writes in place instead of re-concatenating the whole history (transformers' DynamicLayer does a
``torch.cat`` of the full cache on every step). ``segments`` reads pasts from these buffers directly.
"""

from __future__ import annotations

import torch


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

    def reserve(self, extra: int, exact: bool = False) -> None:
        """Make room for ``extra`` more tokens: geometric growth keeps appends amortised O(1); ``exact``
        for scratch space (candidate scoring) that must not double a cached context's memory."""
        need = self.length + extra
        if need <= self.capacity:
            return
        cap = need if exact else max(need, self.capacity * 2)
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

"""An LRU cache of context KV, bounded in bytes, matched by longest common prefix.

An agent's turn t+1 context is turn t's context plus the chosen rationale, the decoded action and the
observation, so keeping the KV of every finished sequence lets the next turn prefill only the
observation. Entries also keep the KV of the candidates last scored on them, so the generation that
follows selection continues from context + chosen candidate without recomputing either.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from ssr_server.engine.torch.kv import SeqKV


@dataclass
class CandidateKV:
    keys: list[torch.Tensor]  # per layer (1, kv_heads, K, head_dim), owned copies
    values: list[torch.Tensor]
    last_logits: torch.Tensor  # (vocab,) float32: the distribution after the candidate's last token

    @property
    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() * 2 for k in self.keys) + self.last_logits.numel() * 4


@dataclass
class CacheEntry:
    key: tuple[int, ...]
    kv: SeqKV
    last_logits: torch.Tensor  # (vocab,) float32, the distribution after the last context token
    next_pos: int  # the rotary position of the token that follows
    candidates: dict[tuple[int, ...], CandidateKV] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes + self.last_logits.numel() * 4 + sum(
            c.nbytes for c in self.candidates.values())


@dataclass(frozen=True)
class Match:
    entry: CacheEntry
    length: int  # tokens of the entry that can be reused (a prefix of the query)


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual case (turn t+1 extends turn t) in one C-level comparison
        return n
    lo, hi = 0, n
    while lo < hi:  # binary search on prefix equality
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class PrefixCache:
    def __init__(self, max_bytes: int, max_entries: int = 256) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[int, ...], CacheEntry] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values())

    def lookup(self, key: tuple[int, ...]) -> Match | None:
        """The entry sharing the longest prefix with ``key`` (marked most recently used)."""
        with self._lock:
            best: Match | None = None
            for entry in self._entries.values():
                n = common_prefix(entry.key, key)
                if n and (best is None or n > best.length):
                    best = Match(entry, n)
            if best is None:
                self.misses += 1
                return None
            self._entries.move_to_end(best.entry.key)
            self.hits += 1
            self.hit_tokens += best.length
            return best

    def insert(self, entry: CacheEntry) -> None:
        with self._lock:
            self._entries[entry.key] = entry
            self._entries.move_to_end(entry.key)
            self._evict()

    def touch(self, entry: CacheEntry) -> None:
        with self._lock:
            if entry.key in self._entries:
                self._entries.move_to_end(entry.key)
            self._evict()

    def _evict(self) -> None:
        total = sum(e.nbytes for e in self._entries.values())
        while self._entries and (total > self.max_bytes or len(self._entries) > self.max_entries):
            if len(self._entries) == 1 and total <= self.max_bytes:
                break
            _, old = self._entries.popitem(last=False)
            total -= old.nbytes

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

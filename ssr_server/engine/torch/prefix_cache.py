"""An LRU cache of context KV, bounded in bytes, matched by longest common prefix (a radix index).

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
from ssr_server.engine.torch.radix import PrefixIndex, RadixIndex, common_prefix

__all__ = ["CacheEntry", "CandidateKV", "Match", "PrefixCache", "common_prefix"]


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
    cache_id: int = -1  # set by PrefixCache.insert

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes + self.last_logits.numel() * 4 + sum(
            c.nbytes for c in self.candidates.values())


@dataclass(frozen=True)
class Match:
    entry: CacheEntry
    length: int  # tokens of the entry that can be reused (a prefix of the query)


class PrefixCache:
    """Entries live in an OrderedDict keyed by a small int (LRU order, MRU last); the index maps keys
    to those ids. Keying the OrderedDict by the token tuples themselves would re-hash a whole tuple
    per entry on every reorder (tuples do not cache their hash)."""

    def __init__(self, max_bytes: int, max_entries: int = 256, index: PrefixIndex | None = None) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._index: PrefixIndex = index if index is not None else RadixIndex()
        self._entries: OrderedDict[int, CacheEntry] = OrderedDict()  # id -> entry, MRU last
        self._ids: dict[tuple[int, ...], int] = {}  # key -> id: an equal key replaces its entry
        self._sizes: dict[int, int] = {}
        self._bytes = 0
        self._next_id = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def lookup(self, key: tuple[int, ...]) -> Match | None:
        """The entry sharing the longest prefix with ``key`` (marked most recently used), preferring
        one whose whole key is that prefix; O(len(key)), whatever the number of entries."""
        with self._lock:
            found = self._index.longest(key)
            if found is None:
                self.misses += 1
                return None
            eid, n = found
            self._entries.move_to_end(eid)
            self.hits += 1
            self.hit_tokens += n
            return Match(self._entries[eid], n)

    def insert(self, entry: CacheEntry) -> None:
        with self._lock:
            old = self._ids.get(entry.key)
            if old is not None:
                self._remove(old)
            eid = self._next_id
            self._next_id += 1
            entry.cache_id = eid
            self._entries[eid] = entry
            self._ids[entry.key] = eid
            self._index.insert(entry.key, eid)
            self._sizes[eid] = entry.nbytes
            self._bytes += self._sizes[eid]
            self._evict()

    def touch(self, entry: CacheEntry) -> None:
        """Mark ``entry`` recently used and account for its new size (it grows when scored)."""
        with self._lock:
            eid = entry.cache_id
            if self._entries.get(eid) is entry:
                self._entries.move_to_end(eid)
                size = entry.nbytes
                self._bytes += size - self._sizes[eid]
                self._sizes[eid] = size
            self._evict()

    def _remove(self, eid: int) -> None:
        entry = self._entries.pop(eid)
        self._ids.pop(entry.key, None)
        self._index.remove(entry.key, eid)
        self._bytes -= self._sizes.pop(eid)

    def _evict(self) -> None:
        while self._entries and (self._bytes > self.max_bytes or len(self._entries) > self.max_entries):
            self._remove(next(iter(self._entries)))

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._ids.clear()
            self._index.clear()
            self._sizes.clear()
            self._bytes = 0

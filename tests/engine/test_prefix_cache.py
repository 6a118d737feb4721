"""Unit tests of the prefix cache (longest-prefix lookup, LRU eviction, common_prefix), SeqKV buffers and
the packed forward's segment plan."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ssr_server.engine.torch import segments
from ssr_server.engine.torch.kv import SeqKV
from ssr_server.engine.torch.prefix_cache import CacheEntry, CandidateKV, PrefixCache, common_prefix
from ssr_server.engine.torch.runner import Chunk

LAYERS, HEADS, DIM = 2, 2, 4
CPU = torch.device("cpu")


def kv_of(length: int, capacity: int | None = None, start: float = 0.0) -> SeqKV:
    """A SeqKV whose token i holds the value ``start + i`` everywhere (keys) / its negation (values)."""
    seq = SeqKV.empty(LAYERS, HEADS, DIM, torch.float32, torch.device("cpu"), capacity=capacity or length)
    if length:
        seq.append(*chunk(length, start))
    return seq


def chunk(t: int, start: float) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    vals = (torch.arange(t, dtype=torch.float32) + start).view(1, 1, t, 1).expand(1, HEADS, t, DIM)
    return ([vals + 1000 * layer for layer in range(LAYERS)],
            [-(vals + 1000 * layer) for layer in range(LAYERS)])


def assert_holds(seq: SeqKV, values: list[float]) -> None:
    assert seq.length == len(values)
    for layer in range(LAYERS):
        k, v = seq.view(layer)
        want = torch.tensor(values).view(1, 1, -1, 1).expand(1, HEADS, -1, DIM) + 1000 * layer
        assert torch.equal(k, want) and torch.equal(v, -want)


def entry(key: tuple[int, ...], capacity: int | None = None) -> CacheEntry:
    return CacheEntry(key, kv_of(len(key), capacity), torch.zeros(8), next_pos=len(key))


# ---------------------------------------------------------------- common_prefix


@pytest.mark.parametrize(("a", "b", "n"), [
    ((), (), 0), ((1, 2, 3), (), 0), ((1, 2, 3), (1, 2, 3), 3), ((1, 2, 3), (1, 2), 2),
    ((1, 2), (1, 2, 3), 2), ((1, 2, 3), (1, 9, 3), 1), ((5,), (6,), 0), ((1, 2, 3, 4), (1, 2, 3, 5), 3),
    ((-7, -7, 1), (-7, -8, 1), 1),
])
def test_common_prefix_examples(a: tuple[int, ...], b: tuple[int, ...], n: int) -> None:
    assert common_prefix(a, b) == n == common_prefix(b, a)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-3, 3), max_size=40), st.lists(st.integers(-3, 3), max_size=40))
def test_common_prefix_property(a: list[int], b: list[int]) -> None:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    assert common_prefix(tuple(a), tuple(b)) == n


# ---------------------------------------------------------------- lookup


def test_lookup_picks_the_longest_prefix() -> None:
    cache = PrefixCache(max_bytes=1 << 30)
    short, long_, other = entry((1, 2, 3)), entry((1, 2, 3, 4, 5)), entry((9, 9))
    for e in (short, long_, other):
        cache.insert(e)
    m = cache.lookup((1, 2, 3, 4, 5, 6, 7))
    assert m is not None and m.entry is long_ and m.length == 5
    m = cache.lookup((1, 2, 3, 4, 0))  # diverges inside the longer entry: still the longest match
    assert m is not None and m.entry is long_ and m.length == 4
    m = cache.lookup((1, 2, 3))
    assert m is not None and m.length == 3 and m.entry in (short, long_)
    m = cache.lookup((1, 7))
    assert m is not None and m.length == 1
    m = cache.lookup((9, 9, 9))
    assert m is not None and m.entry is other and m.length == 2
    assert cache.lookup((4, 4)) is None
    assert cache.hits == 5 and cache.misses == 1 and cache.hit_tokens == 5 + 4 + 3 + 1 + 2


def test_lookup_on_empty_cache_and_reinsert() -> None:
    cache = PrefixCache(max_bytes=1 << 30)
    assert cache.lookup((1, 2)) is None and len(cache) == 0
    cache.insert(entry((1, 2)))
    newer = entry((1, 2))
    cache.insert(newer)  # same key: replaced, not duplicated
    assert len(cache) == 1
    m = cache.lookup((1, 2))
    assert m is not None and m.entry is newer
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0


# ---------------------------------------------------------------- eviction


def test_evicts_least_recently_used_by_bytes() -> None:
    one = entry((1,) * 10).nbytes
    cache = PrefixCache(max_bytes=2 * one + one // 2)  # room for two entries
    a, b, c = entry((1,) * 10), entry((2,) * 10), entry((3,) * 10)
    cache.insert(a)
    cache.insert(b)
    assert cache.lookup((1, 1)) is not None  # a becomes most recently used
    cache.insert(c)
    assert len(cache) == 2 and cache.nbytes <= cache.max_bytes
    assert cache.lookup((2, 2)) is None  # b was the LRU one
    assert cache.lookup((1, 1)) is not None and cache.lookup((3, 3)) is not None


def test_evicts_by_entry_count() -> None:
    cache = PrefixCache(max_bytes=1 << 30, max_entries=3)
    for i in range(5):
        cache.insert(entry((i, i)))
    assert len(cache) == 3
    assert [cache.lookup((i, i)) is not None for i in range(5)] == [False, False, True, True, True]


def test_entry_larger_than_the_budget_is_not_kept() -> None:
    small = entry((1, 2))
    cache = PrefixCache(max_bytes=small.nbytes + 1)
    cache.insert(small)
    cache.insert(entry((5,) * 100))
    assert cache.nbytes <= cache.max_bytes
    assert cache.lookup((5, 5)) is None


def test_bytes_count_capacity_logits_and_candidates() -> None:
    e = entry((1, 2, 3), capacity=10)
    kv_bytes = LAYERS * 2 * HEADS * 10 * DIM * 4
    assert e.kv.nbytes == kv_bytes
    assert e.nbytes == kv_bytes + 8 * 4
    keys, values = chunk(2, 0.0)
    e.candidates[(7, 8)] = CandidateKV([k.clone() for k in keys], [v.clone() for v in values], torch.zeros(8))
    assert e.nbytes == kv_bytes + 8 * 4 + LAYERS * 2 * HEADS * 2 * DIM * 4 + 8 * 4


def test_touch_grows_are_accounted_and_evict() -> None:
    """An entry that grew after insertion (candidates attached) is re-checked against the budget."""
    a, b = entry((1,) * 4), entry((2,) * 4)
    cache = PrefixCache(max_bytes=a.nbytes + b.nbytes + 64)
    cache.insert(a)
    cache.insert(b)
    keys, values = chunk(4, 0.0)
    b.candidates[(3,)] = CandidateKV(keys, values, torch.zeros(8))
    assert a.nbytes + b.nbytes > cache.max_bytes >= b.nbytes
    cache.touch(b)
    assert len(cache) == 1 and cache.lookup((2, 2)) is not None


# ---------------------------------------------------------------- SeqKV


def test_append_grows_and_keeps_contents() -> None:
    seq = kv_of(0, capacity=4)
    seq.append(*chunk(3, 0.0))
    seq.append(*chunk(5, 3.0))  # beyond capacity: regrows
    seq.append(*chunk(1, 8.0))
    assert seq.capacity >= 9
    assert_holds(seq, [float(i) for i in range(9)])


def test_reserve_is_geometric_and_keeps_contents() -> None:
    seq = kv_of(6, capacity=8)
    seq.reserve(2)
    assert seq.capacity == 8  # fits: no reallocation
    seq.reserve(3)
    assert seq.capacity == 16  # doubled
    seq.reserve(100)
    assert seq.capacity == 106  # exactly what is needed when doubling is not enough
    assert_holds(seq, [float(i) for i in range(6)])


def test_fork_is_an_independent_copy() -> None:
    seq = kv_of(6, capacity=6)
    full = seq.fork(extra=4)
    part = seq.fork(3, extra=1)
    assert full.capacity >= 10 and part.length == 3 and part.capacity >= 4
    assert_holds(full, [float(i) for i in range(6)])
    assert_holds(part, [0.0, 1.0, 2.0])
    part.append(*chunk(2, 50.0))  # writing into the fork never touches the original
    full.append(*chunk(1, 60.0))
    assert_holds(part, [0.0, 1.0, 2.0, 50.0, 51.0])
    assert_holds(full, [*(float(i) for i in range(6)), 60.0])
    assert_holds(seq, [float(i) for i in range(6)])


def test_view_limits_length() -> None:
    seq = kv_of(5, capacity=12)
    k, v = seq.view(1, 2)
    assert k.shape == (1, HEADS, 2, DIM) and v.shape == (1, HEADS, 2, DIM)
    assert seq.nbytes == LAYERS * 2 * HEADS * 12 * DIM * 4


# ---------------------------------------------------------------- segments (the packed forward's plan)


def chunk_on(past: SeqKV | None, t: int, past_len: int | None = None) -> Chunk:
    n = (past.length if past is not None else 0) if past_len is None else past_len
    return Chunk(past, list(range(t)), torch.zeros(1, t, dtype=torch.long), [t - 1], past_len=n)


def test_plan_groups_consecutive_chunks_on_one_past() -> None:
    a, b = kv_of(4, capacity=4), kv_of(3, capacity=8)
    chunks = [chunk_on(a, 2), chunk_on(a, 3), chunk_on(b, 1), chunk_on(None, 2)]
    segs = segments.plan(chunks, torch.float32, CPU)
    assert [(s.start, s.end, s.past_len, s.bounds) for s in segs] == [
        (0, 5, 4, [(0, 2), (2, 5)]), (5, 6, 3, [(0, 1)]), (6, 8, 0, [(0, 2)])]
    assert segs[0].past is a and segs[1].past is b and segs[2].past is None
    # exclusive pasts used at their end are written in place: room is reserved, contents kept
    assert segs[0].inplace and segs[1].inplace and not segs[2].inplace
    assert a.capacity >= 4 + 5 and a.length == 4
    assert_holds(a, [0.0, 1.0, 2.0, 3.0])


def test_plan_masks_are_block_causal_over_the_past() -> None:
    a = kv_of(3)
    (seg,) = segments.plan([chunk_on(a, 2), chunk_on(a, 3)], torch.float32, CPU)
    assert seg.mask is not None and seg.mask.shape == (1, 1, 5, 3 + 5)
    seen = (seg.mask[0, 0] == 0).int().tolist()
    assert seen == [
        [1, 1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0, 1, 0, 0],
        [1, 1, 1, 0, 0, 1, 1, 0],
        [1, 1, 1, 0, 0, 1, 1, 1],
    ]
    assert seg.mask.min().item() == torch.finfo(torch.float32).min
    (one,) = segments.plan([chunk_on(a, 1)], torch.float32, CPU)
    assert one.mask is None  # a single decode token sees its whole past: no mask at all


def test_plan_shared_or_partial_pasts_are_not_written() -> None:
    a, b = kv_of(4, capacity=4), kv_of(4, capacity=4)
    segs = segments.plan([chunk_on(a, 2), chunk_on(b, 1), chunk_on(a, 2)], torch.float32, CPU)
    assert len(segs) == 3 and not segs[0].inplace and not segs[2].inplace  # a is used twice
    assert segs[1].inplace
    assert a.capacity == 4  # nothing reserved in a past that is not written
    (part,) = segments.plan([chunk_on(b, 2, past_len=2)], torch.float32, CPU)
    assert not part.inplace and part.past_len == 2  # a prefix of b: its tail must not be overwritten

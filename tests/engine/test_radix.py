"""The radix index behind the prefix cache: the longest match equals a brute-force scan, whatever the
inserts and removals; entries whose whole key is the match are preferred; removals prune and merge."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ssr_server.engine.torch.radix import RadixIndex, _Node, common_prefix

keys = st.lists(st.integers(-3, 3), min_size=1, max_size=12).map(tuple)


def brute(live: dict[int, tuple[int, ...]], q: tuple[int, ...]) -> int:
    return max((common_prefix(k, q) for k in live.values()), default=0)


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), keys), min_size=1, max_size=30),
       queries=st.lists(keys, max_size=8))
def test_longest_matches_a_scan(ops: list[tuple[bool, tuple[int, ...]]],
                                queries: list[tuple[int, ...]]) -> None:
    index, live = RadixIndex(), dict[int, tuple[int, ...]]()
    for i, (add, key) in enumerate(ops):
        victim = next((eid for eid, k in live.items() if k == key), None)
        if add or victim is None:
            index.insert(key, i)
            live[i] = key
        else:
            index.remove(key, victim)
            del live[victim]
    for q in [*queries, *live.values()]:
        found = index.longest(q)
        n = brute(live, q)
        if n == 0:
            assert found is None
        else:
            assert found is not None and found[1] == n and common_prefix(live[found[0]], q) == n
            if any(len(k) == n and q[:n] == k for k in live.values()):
                assert len(live[found[0]]) == n  # a whole-key match is preferred


def size(node: _Node) -> int:
    return 1 + sum(size(c) for c in node.children.values())


def test_removal_prunes_and_merges() -> None:
    index = RadixIndex()
    index.insert((1, 2, 3, 4), 0)
    index.insert((1, 2, 9), 1)
    assert size(index.root) == 4  # root, (1, 2), (3, 4), (9,)
    index.remove((1, 2, 9), 1)
    assert size(index.root) == 2 and index.root.children[1].edge == (1, 2, 3, 4)  # merged back
    assert index.longest((1, 2, 3, 5)) == (0, 3)
    index.remove((1, 2, 3, 4), 0)
    assert index.root.children == {} and index.longest((1, 2)) is None


def test_equal_keys_and_prefix_keys() -> None:
    index = RadixIndex()
    index.insert((5, 6, 7), 0)
    index.insert((5, 6), 1)  # a prefix of a cached key: ends mid-edge, splits it
    index.insert((5, 6, 7), 2)
    assert index.longest((5, 6)) == (1, 2)
    assert index.longest((5, 6, 7, 8))[1] == 3  # type: ignore[index]
    assert index.longest((5, 6, 7, 8))[0] in (0, 2)  # type: ignore[index]
    index.remove((5, 6, 7), 2)
    assert index.longest((5, 6, 7)) == (0, 3)

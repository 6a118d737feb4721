"""Longest-prefix lookup over token keys: a radix tree (SGLang's structure, without its paged KV).

The prefix cache keeps whole sequences (each with its own KV buffer); this index only answers "which
cached key shares the longest prefix with this query, and how long is it" in O(query length): one
slice comparison per edge walked, one dict lookup per node. The list scan it replaces compared the
query with every entry (256 entries of ~1,000 tokens: ~1.6 ms per lookup when keys were hashed in the
loop, see prefix_cache.py). Keys hold image pads as negative per-image ids, so an image prefix matches
only for the same pixels.
"""

from __future__ import annotations

from typing import Protocol


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Length of the common prefix, in O(common prefix): galloping then binary search on slices
    (tuple slice comparison runs in C; a Python loop per token is ~30x slower)."""
    n = min(len(a), len(b))
    lo, step = 0, 64
    while lo < n:  # gallop: grow the known-equal prefix while the next block matches
        hi = min(n, lo + step)
        if a[lo:hi] != b[lo:hi]:
            break
        lo, step = hi, step * 2
    else:
        return n
    while lo < hi:  # a[:lo] == b[:lo] and a[:hi] != b[:hi]: binary search in between
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class PrefixIndex(Protocol):
    """What the prefix cache needs from an index of its keys (entry ids are small ints)."""

    def insert(self, key: tuple[int, ...], eid: int) -> None: ...

    def remove(self, key: tuple[int, ...], eid: int) -> None: ...

    def longest(self, key: tuple[int, ...]) -> tuple[int, int] | None:
        """(entry id, matched length) of an entry sharing the longest prefix with ``key``, preferring
        one whose whole key is that prefix; None when no entry shares a first token."""
        ...

    def clear(self) -> None: ...


class _Node:
    __slots__ = ("children", "edge", "ends", "owners", "parent")

    def __init__(self, edge: tuple[int, ...], parent: _Node | None) -> None:
        self.edge = edge  # the tokens from the parent to this node
        self.parent = parent
        self.children: dict[int, _Node] = {}  # first token of the child's edge -> child
        self.owners: dict[int, None] = {}  # entries whose key runs through (or ends at) this node
        self.ends: dict[int, None] = {}  # entries whose key ends exactly here


class RadixIndex:
    """A compressed trie of the cached keys; every node knows the entries below it."""

    def __init__(self) -> None:
        self.root = _Node((), None)

    def clear(self) -> None:
        self.root = _Node((), None)

    def insert(self, key: tuple[int, ...], eid: int) -> None:
        node, i = self.root, 0
        while i < len(key):
            child = node.children.get(key[i])
            if child is None:
                leaf = _Node(key[i:], node)
                node.children[key[i]] = leaf
                leaf.owners[eid] = None
                leaf.ends[eid] = None
                return
            n = common_prefix(child.edge, key[i : i + len(child.edge)])
            if n < len(child.edge):
                child = self._split(child, n)
            child.owners[eid] = None
            node, i = child, i + n
        node.ends[eid] = None  # the empty key ends at the root

    def _split(self, child: _Node, n: int) -> _Node:
        """Cut ``child``'s edge after ``n`` tokens; returns the new middle node."""
        parent = child.parent
        assert parent is not None  # internal invariant: the root is never split
        mid = _Node(child.edge[:n], parent)
        mid.owners = dict(child.owners)
        parent.children[child.edge[0]] = mid
        child.edge = child.edge[n:]
        child.parent = mid
        mid.children[child.edge[0]] = child
        return mid

    def remove(self, key: tuple[int, ...], eid: int) -> None:
        node, i = self.root, 0
        path: list[_Node] = []
        while i < len(key):
            child = node.children.get(key[i])
            if child is None or key[i : i + len(child.edge)] != child.edge:
                return  # not indexed (internal misuse): nothing to do
            path.append(child)
            node, i = child, i + len(child.edge)
        node.ends.pop(eid, None)
        for n in path:
            n.owners.pop(eid, None)
        for n in reversed(path):  # drop nodes no entry runs through; merge chains left behind
            parent = n.parent
            assert parent is not None
            if not n.owners:
                del parent.children[n.edge[0]]
            elif len(n.children) == 1 and not n.ends:
                (only,) = n.children.values()
                only.edge = n.edge + only.edge
                only.parent = parent
                parent.children[n.edge[0]] = only

    def longest(self, key: tuple[int, ...]) -> tuple[int, int] | None:
        node, i = self.root, 0
        partial = False
        while i < len(key):
            child = node.children.get(key[i])
            if child is None:
                break
            n = common_prefix(child.edge, key[i : i + len(child.edge)])
            node, i = child, i + n
            if n < len(child.edge):
                partial = True
                break
        if i == 0:
            return None
        pool = node.owners if partial or not node.ends else node.ends
        return next(reversed(pool)), i  # the newest of them

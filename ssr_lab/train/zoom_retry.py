"""Zoom-retry drills: a detail drill whose first zoom misses the plaque and whose second finds it.

The shipped model's zoom boxes miss the plaque on about a quarter of the test split's detail questions
(S28: 133 of 487 calls, the box's centre 1.5-2.8 gold widths to one side), and it then answers from
the crop it got: "E" for 113 of them. It never zooms twice, because no trajectory ever showed it a crop
without the plaque. A retry drill does: its zoom turn is written twice, first at the styled box moved
sideways off the plaque (as far as the model's own misses are: ``MISS_SHIFT`` gold widths) with the
tool's crop there, then at the gold box with its crop, then the answer. The loss is on what a model has
to learn from it, the second zoom turn whole (zoom again after a crop without the plaque, and where)
and the answer turn; the first turn's box is a miss and teaches nothing.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from ssr_lab.train.data import occurrences
from ssr_lab.world.views import ZOOM_PAD, shift_box

Box = tuple[int, int, int, int]
MISS_SHIFT = (1.6, 2.8)  # gold widths a missed box's centre lies to one side (S28's misses: 1.5-2.8)


def plaque_columns(gold: Sequence[int]) -> tuple[float, float]:
    """The plaque's left and right edge (0-1000) inside its gold box, which pads it by ``ZOOM_PAD``."""
    x1, x2 = gold[0], gold[2]
    inner = (x2 - x1) / (1 + 2 * ZOOM_PAD)
    centre = (x1 + x2) / 2
    return centre - inner / 2, centre + inner / 2


def miss_box(written: Sequence[int], gold: Sequence[int], rng: random.Random) -> Box | None:
    """``written`` (the styled box of the gold box ``gold``) moved sideways until no column of the plaque
    is in it: to a random side by a random ``MISS_SHIFT`` of gold widths (farther if that still shows
    part of the plaque), else to the other side; None when the picture has no room on either side."""
    drawn = rng.uniform(*MISS_SHIFT) * (gold[2] - gold[0])
    left, right = plaque_columns(gold)
    clear = {-1: written[2] - math.floor(left), 1: math.ceil(right) - written[0]}  # the least shift that does
    first = rng.choice((-1, 1))
    for sign in (first, -first):
        box = shift_box(written, sign * max(drawn, clear[sign]))
        if box[2] <= left or box[0] >= right:
            return box
    return None


def assistant_spans(mask: Sequence[bool]) -> list[tuple[int, int]]:
    """The [start, end) runs of True in ``mask``: the assistant turns of a trajectory."""
    spans: list[tuple[int, int]] = []
    i = 0
    while i < len(mask):
        if mask[i]:
            j = i
            while j < len(mask) and mask[j]:
                j += 1
            spans.append((i, j))
            i = j
        else:
            i += 1
    return spans


def _find_once(ids: Sequence[int], part: Sequence[int]) -> int | None:
    hits = occurrences(ids, part)
    return hits[0] if len(hits) == 1 else None


def missed_zoom(ids: Sequence[int], mask: Sequence[bool], box: Sequence[int], miss: Sequence[int],
                index: tuple[Sequence[int], Sequence[int]],
                ) -> tuple[list[int], list[bool]] | None:
    """A one-zoom trajectory (``ids``, ``mask``: its assistant turns, the zoom call's ``box`` tokens in
    the first) with its zoom turn and observation written twice: first with the ``miss`` box's tokens,
    then as they were, the second observation numbering its crop one higher (``index``: the tokens
    naming the first crop and those naming the second). The mask is on the second zoom turn and the
    turns after it. None when the trajectory is not that shape."""
    spans = assistant_spans(mask)
    if len(spans) < 2:
        return None
    (a1, b1), (a2, _) = spans[0], spans[1]
    turn, seen = list(ids[a1:b1]), list(ids[b1:a2])
    at, name = _find_once(turn, box), _find_once(seen, index[0])
    if at is None or name is None:
        return None
    missed = turn[:at] + list(miss) + turn[at + len(box):]
    again = seen[:name] + list(index[1]) + seen[name + len(index[0]):]
    head, tail = list(ids[:a1]), list(ids[a2:])
    out = head + missed + seen + turn + again + tail
    flags = ([False] * (len(head) + len(missed) + len(seen)) + [True] * len(turn) + [False] * len(again)
             + list(mask[a2:]))
    return out, flags

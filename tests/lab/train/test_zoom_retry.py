"""Zoom-retry drills' parts: the missed box, the assistant turns, the splice of a second zoom turn."""

from __future__ import annotations

import random

import pytest

from ssr_lab.train.zoom_retry import MISS_SHIFT, assistant_spans, miss_box, missed_zoom, plaque_columns
from ssr_lab.world.views import styled_box


def test_the_plaque_is_the_gold_box_without_its_padding() -> None:
    # the gold box pads the plaque by 0.4 of its width each side: 180 wide holds a plaque 100 wide
    assert plaque_columns((400, 0, 580, 50)) == pytest.approx((440.0, 540.0))


def test_a_missed_box_keeps_its_rows_and_size_and_shows_no_column_of_the_plaque() -> None:
    rng = random.Random(0)
    sides = set()
    for _ in range(400):
        x1 = rng.randint(0, 870)
        gold = (x1, rng.randint(0, 700), x1 + rng.randint(60, 130), 0)
        gold = (gold[0], gold[1], gold[2], gold[1] + 150)
        written = styled_box(gold, "wide")
        miss = miss_box(written, gold, rng)
        assert miss is not None  # a wide box is at most 390 of the 1000 columns: room on one side
        left, right = plaque_columns(gold)
        assert miss[2] <= left or miss[0] >= right
        assert (miss[1], miss[3]) == (written[1], written[3])
        assert miss[2] - miss[0] == written[2] - written[0]
        assert miss[0] >= 0 and miss[2] <= 1000
        sides.add(miss[0] < written[0])
        if miss[0] > 0 and miss[2] < 1000:  # not pushed against an edge: the drawn distance or more
            shift = abs((miss[0] + miss[2]) - (written[0] + written[2])) / 2 / (gold[2] - gold[0])
            assert shift >= MISS_SHIFT[0] - 0.01
    assert sides == {True, False}


def test_no_missed_box_when_the_box_fills_the_picture_width() -> None:
    gold = (450, 300, 560, 400)
    assert miss_box((0, 300, 1000, 400), gold, random.Random(1)) is None


def test_assistant_spans_are_the_runs_of_the_mask() -> None:
    f, t = False, True
    assert assistant_spans([f, t, t, f, f, t, f, t]) == [(1, 3), (5, 6), (7, 8)]
    assert assistant_spans([]) == []


def test_the_splice_writes_the_zoom_turn_twice_the_first_with_the_miss() -> None:
    # prompt 1 2 | zoom turn 10 [50 51] 11 | observation 20 [91] 21 | answer turn 30 31 | 0
    ids = [1, 2, 10, 50, 51, 11, 20, 91, 21, 30, 31, 0]
    mask = [False, False, True, True, True, True, False, False, False, True, True, False]
    out = missed_zoom(ids, mask, [50, 51], [60, 61], ([91], [92]))
    assert out is not None
    new, flags = out
    assert new == [1, 2, 10, 60, 61, 11, 20, 91, 21, 10, 50, 51, 11, 20, 92, 21, 30, 31, 0]
    assert [i for i, f in zip(new, flags, strict=True) if f] == [10, 50, 51, 11, 30, 31]


def test_no_splice_without_the_box_once_in_the_first_turn_or_a_second_turn() -> None:
    ids, mask = [1, 10, 50, 11, 20, 91, 30], [False, True, True, True, False, False, True]
    assert missed_zoom(ids, mask, [77], [60], ([91], [92])) is None  # the box is not there
    assert missed_zoom(ids, mask, [50], [60], ([99], [92])) is None  # nor the crop's name
    assert missed_zoom(ids[:4], mask[:4], [50], [60], ([91], [92])) is None  # one turn only

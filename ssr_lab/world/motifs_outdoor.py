"""Pictograms of landmarks, animals and plants, each with ``n`` countable parts (see ``motif_kit``)."""

from __future__ import annotations

import itertools
import random

from PIL.ImageDraw import ImageDraw as Draw

from ssr_lab.world.closed_sets import RGB
from ssr_lab.world.motif_kit import motif, spread, window_ink
from ssr_lab.world.scene import shade


@motif("tower")
def _tower(d: Draw, c: RGB, n: int, cx: int, gy: int, rng: random.Random) -> None:
    w, top = rng.randint(30, 40), gy - 40 - 25 * n
    d.rectangle((cx - w, top, cx + w, gy), fill=c)
    d.polygon([(cx - w - 8, top), (cx, top - 34), (cx + w + 8, top)], fill=shade(c, 0.7))
    for y in range(n):
        wy = top + 14 + 25 * y
        d.rectangle((cx - 12, wy, cx + 12, wy + 14), fill=window_ink(c))
    d.rectangle((cx - 14, gy - 22, cx + 14, gy), fill=shade(c, 0.55))


@motif("bridge")
def _bridge(d: Draw, c: RGB, n: int, cx: int, gy: int, rng: random.Random) -> None:
    deck = gy - rng.randint(80, 110)
    d.rectangle((cx - 100, deck - 14, cx + 100, deck), fill=c)
    xs = spread(n + 1, cx - 96, cx + 96)
    for a, b in itertools.pairwise(xs):
        d.arc((a, deck - 2, b, 2 * gy - deck), 180, 360, fill=c, width=11)
    for x in xs:
        d.rectangle((x - 6, deck, x + 6, gy), fill=shade(c, 0.85))


@motif("lighthouse")
def _lighthouse(d: Draw, c: RGB, n: int, cx: int, gy: int, rng: random.Random) -> None:
    light = 0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2] > 170
    body = (80, 80, 86) if light else (246, 246, 240)  # stripes must stand out from the body
    bands, height = 2 * n + 1, 176
    bh = height / bands
    for k in range(bands):
        y1, y0 = gy - bh * k, gy - bh * (k + 1)
        w1, w0 = 34 - 12 * k / bands, 34 - 12 * (k + 1) / bands
        d.polygon([(cx - w1, y1), (cx - w0, y0), (cx + w0, y0), (cx + w1, y1)], fill=c if k % 2 else body)
    d.rectangle((cx - 18, gy - height - 20, cx + 18, gy - height), fill=(255, 240, 130))
    d.polygon([(cx - 22, gy - height - 20), (cx, gy - height - 36), (cx + 22, gy - height - 20)],
              fill=(60, 60, 60))


@motif("gate")
def _gate(d: Draw, c: RGB, n: int, cx: int, gy: int, rng: random.Random) -> None:
    top = gy - rng.randint(110, 140)
    d.rectangle((cx - 100, top - 22, cx + 100, top), fill=c)
    d.polygon([(cx - 100, top - 22), (cx, top - 60), (cx + 100, top - 22)], fill=shade(c, 0.8))
    for x in spread(n, cx - 86, cx + 86):
        d.rectangle((x - 8, top, x + 8, gy), fill=c)
    d.rectangle((cx - 104, gy - 6, cx + 104, gy + 4), fill=shade(c, 0.6))


def _dots(d: Draw, n: int, cx: int, cy: int, dx: int, dy: int, r: int, ink: RGB) -> None:
    """``n`` (<= 6) well-separated round spots in two rows of a 3-column grid."""
    slots = [(-1, -1), (0, -1), (1, -1), (-1, 1), (0, 1), (1, 1)]
    order = {1: [1], 2: [0, 5], 3: [0, 2, 4], 4: [0, 2, 3, 5], 5: [0, 2, 3, 4, 5], 6: [0, 1, 2, 3, 4, 5]}
    for i in order[n]:
        sx, sy = slots[i]
        x, y = cx + sx * dx, cy + sy * dy
        d.ellipse((x - r, y - r, x + r, y + r), fill=ink)


@motif("beetle")
def _beetle(d: Draw, c: RGB, n: int, cx: int, gy: int, rng: random.Random) -> None:
    cy = gy - 70
    for k in (-50, 0, 50):
        d.line((cx + k, cy, cx + k - 20, gy), fill=(30, 30, 30), width=5)
        d.line((cx + k, cy, cx + k + 20, gy), fill=(30, 30, 30), width=5)
    d.ellipse((cx + 62, cy - 30, cx + 112, cy + 20), fill=(40, 36, 34))
    d.ellipse((cx - 92, cy - 56, cx + 78, cy + 52), fill=c)
    d.line((cx - 92, cy - 2, cx + 78, cy - 2), fill=shade(c, 0.6), width=3)
    _dots(d, n, cx - 7, cy, 52, 26, 12, window_ink(c))


@motif("fish")
def _fish(d: Draw, c: RGB, n: int, cx: int, gy: int, rng: random.Random) -> None:
    d.ellipse((cx - 110, gy - 24, cx + 110, gy + 30), fill=(112, 140, 150))
    cy = gy - 80
    d.polygon([(cx - 70, cy), (cx - 100, cy - 42), (cx - 100, cy + 42)], fill=shade(c, 0.8))
    d.ellipse((cx - 80, cy - 48, cx + 96, cy + 48), fill=c)
    for x in spread(n, cx - 46, cx + 50):
        d.rectangle((x - 6, cy - 40, x + 6, cy + 40), fill=window_ink(c))
    d.ellipse((cx + 66, cy - 16, cx + 80, cy - 2), fill=(15, 15, 15))


@motif("caterpillar")
def _caterpillar(d: Draw, c: RGB, n: int, cx: int, gy: int, rng: random.Random) -> None:
    r = 20
    head_x = cx + 96 - r
    xs = spread(n, cx - 96 + r, head_x - 2 * r - 6) if n > 1 else [head_x - 2 * r - 6]
    for x in xs:
        d.line((x, gy - r, x, gy + 6), fill=(40, 40, 40), width=4)
        d.ellipse((x - r, gy - 2 * r - 10, x + r, gy - 10), fill=c, outline=shade(c, 0.5), width=2)
    head = (60, 44, 36) if sum(c) > 200 else (150, 150, 150)
    d.ellipse((head_x - r - 2, gy - 2 * r - 24, head_x + r + 2, gy - 20), fill=head)
    d.ellipse((head_x + 2, gy - 2 * r - 12, head_x + 12, gy - 2 * r - 2), fill=(250, 250, 250))


@motif("flower")
def _flower(d: Draw, c: RGB, n: int, cx: int, gy: int, rng: random.Random) -> None:
    centre = (110, 70, 30) if c[1] > 180 and c[2] < 100 else (245, 215, 60)
    for k, x in enumerate(spread(n, cx - 84, cx + 84)):
        y = gy - (130 if k % 2 == 0 else 80)
        d.line((x, y, x, gy + 4), fill=(50, 110, 50), width=5)
        for dx, dy in ((-11, 0), (11, 0), (0, -11), (0, 11)):
            d.ellipse((x + dx - 11, y + dy - 11, x + dx + 11, y + dy + 11), fill=c, outline=shade(c, 0.6))
        d.ellipse((x - 7, y - 7, x + 7, y + 7), fill=centre)


@motif("cactus")
def _cactus(d: Draw, c: RGB, n: int, cx: int, gy: int, rng: random.Random) -> None:
    green = (70, 128, 72)
    d.rounded_rectangle((cx - 16, gy - 170, cx + 16, gy - 20), radius=14, fill=green)
    for k in range(n):
        side = -1 if k % 2 == 0 else 1
        y = gy - 60 - 32 * (k // 2) - (12 if side > 0 else 0)
        d.rectangle(sorted_box(cx + side * 16, y - 8, cx + side * 56, y + 8), fill=green)
        d.rounded_rectangle(sorted_box(cx + side * 40, y - 40, cx + side * 58, y + 8), radius=8, fill=green)
    d.polygon([(cx - 44, gy - 30), (cx + 44, gy - 30), (cx + 32, gy + 16), (cx - 32, gy + 16)], fill=c)
    d.rectangle((cx - 48, gy - 38, cx + 48, gy - 26), fill=shade(c, 0.75))


def sorted_box(x0: int, y0: int, x1: int, y1: int) -> tuple[int, int, int, int]:
    return min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1)


@motif("fruit_tree")
def _fruit_tree(d: Draw, c: RGB, n: int, cx: int, gy: int, rng: random.Random) -> None:
    d.rectangle((cx - 12, gy - 90, cx + 12, gy + 4), fill=(110, 76, 44))
    d.ellipse((cx - 96, gy - 186, cx + 96, gy - 60), fill=(74, 112, 62))
    slots = [(-50, -150), (0, -160), (50, -150), (-60, -100), (0, -110), (60, -100)]
    order = {1: [1], 2: [3, 5], 3: [1, 3, 5], 4: [0, 2, 3, 5], 5: [0, 1, 2, 3, 5], 6: [0, 1, 2, 3, 4, 5]}
    for i in order[n]:
        x, y = cx + slots[i][0], gy + slots[i][1]
        d.ellipse((x - 14, y - 14, x + 14, y + 14), fill=c, outline=(20, 20, 20), width=2)

"""Pictograms of artworks, vehicles and dishes, each with ``n`` countable parts (see ``motif_kit``)."""

from __future__ import annotations

import random

from PIL.ImageDraw import ImageDraw as Draw

from ssr_lab.world.closed_sets import RGB
from ssr_lab.world.motif_kit import PlaqueSpot, emblem_star, motif, spread, window_ink
from ssr_lab.world.scene import PLAQUE_H, mix, shade

FRAME_TOP = 150  # a painting's frame spans gy - FRAME_TOP .. gy - 20


def _frame(d: Draw, c: RGB, cx: int, gy: int, inner: RGB) -> tuple[int, int, int, int]:
    x0, y0, x1, y1 = cx - 100, gy - FRAME_TOP - 10, cx + 100, gy - 16
    d.rectangle((x0, y0, x1, y1), fill=c, outline=shade(c, 0.6), width=3)
    d.rectangle((x0 + 16, y0 + 16, x1 - 16, y1 - 16), fill=inner)
    return x0 + 16, y0 + 16, x1 - 16, y1 - 16


def _label_spot(cx: int, gy: int) -> PlaqueSpot:
    """The museum label hangs on the wall under the frame."""
    return cx + 60, gy - 12, None


@motif("orchard")
def _orchard(d: Draw, c: RGB, n: int, cx: int, gy: int, rng: random.Random) -> PlaqueSpot:
    x0, _, x1, y1 = _frame(d, c, cx, gy, (214, 226, 232))
    d.rectangle((x0, y1 - 30, x1, y1), fill=(150, 170, 110))
    for x in spread(n, x0 + 20, x1 - 20):
        d.rectangle((x - 3, y1 - 46, x + 3, y1 - 18), fill=(100, 70, 40))
        d.ellipse((x - 11, y1 - 74, x + 11, y1 - 42), fill=(60, 110, 60))
    return _label_spot(cx, gy)


@motif("harbour")
def _harbour(d: Draw, c: RGB, n: int, cx: int, gy: int, rng: random.Random) -> PlaqueSpot:
    x0, _, x1, y1 = _frame(d, c, cx, gy, (220, 214, 196))
    d.rectangle((x0, y1 - 40, x1, y1), fill=(96, 126, 150))
    for x in spread(n, x0 + 16, x1 - 16):
        hull = [(x - 10, y1 - 34), (x + 10, y1 - 34), (x + 7, y1 - 26), (x - 7, y1 - 26)]
        d.polygon(hull, fill=(70, 50, 40))
        d.polygon([(x, y1 - 62), (x, y1 - 36), (x + 10, y1 - 36)], fill=(250, 250, 246))
    return _label_spot(cx, gy)


@motif("nocturne")
def _nocturne(d: Draw, c: RGB, n: int, cx: int, gy: int, rng: random.Random) -> PlaqueSpot:
    x0, y0, x1, y1 = _frame(d, c, cx, gy, (30, 36, 70))
    d.rectangle((x0, y1 - 22, x1, y1), fill=(40, 50, 40))
    ys = (y0 + 22, y0 + 46)
    for k, x in enumerate(spread(n, x0 + 16, x1 - 16)):
        emblem_star(d, x, ys[k % 2], 11, (250, 226, 90))
    return _label_spot(cx, gy)


@motif("flight")
def _flight(d: Draw, c: RGB, n: int, cx: int, gy: int, rng: random.Random) -> PlaqueSpot:
    x0, y0, x1, _ = _frame(d, c, cx, gy, (200, 220, 236))
    ys = (y0 + 30, y0 + 54)
    for k, x in enumerate(spread(n, x0 + 16, x1 - 16)):
        y = ys[k % 2]
        d.line([(x - 11, y - 7), (x, y), (x + 11, y - 7)], fill=(30, 30, 34), width=4)
    return _label_spot(cx, gy)


def _wheel(d: Draw, x: int, y: int, r: int) -> None:
    d.ellipse((x - r, y - r, x + r, y + r), fill=(28, 28, 28))
    d.ellipse((x - r // 2, y - r // 2, x + r // 2, y + r // 2), fill=(160, 160, 160))


def _badge(cx: int, y: int) -> PlaqueSpot:
    return cx, y, None


@motif("tram")
def _tram(d: Draw, c: RGB, n: int, cx: int, gy: int, rng: random.Random) -> PlaqueSpot:
    d.line((cx - 100, gy + 2, cx + 100, gy + 2), fill=(70, 70, 70), width=4)
    d.line((cx - 20, gy - 110, cx + 20, gy - 140), fill=(40, 40, 40), width=4)
    d.rounded_rectangle((cx - 100, gy - 110, cx + 100, gy - 14), radius=18, fill=c)
    for x in spread(n, cx - 80, cx + 80):
        d.rectangle((x - 11, gy - 96, x + 11, gy - 70), fill=window_ink(c))
    _wheel(d, cx - 64, gy - 12, 12)
    _wheel(d, cx + 64, gy - 12, 12)
    return _badge(cx, gy - 56)


@motif("bus")
def _bus(d: Draw, c: RGB, n: int, cx: int, gy: int, rng: random.Random) -> PlaqueSpot:
    d.rounded_rectangle((cx - 100, gy - 130, cx + 100, gy - 16), radius=10, fill=c)
    d.rectangle((cx - 100, gy - 60, cx + 100, gy - 52), fill=shade(c, 0.6))
    for x in spread(n, cx - 78, cx + 78):
        d.rectangle((x - 12, gy - 118, x + 12, gy - 88), fill=window_ink(c))
    _wheel(d, cx - 60, gy - 14, 18)
    _wheel(d, cx + 60, gy - 14, 18)
    return _badge(cx, gy - 48)


@motif("locomotive")
def _locomotive(d: Draw, c: RGB, n: int, cx: int, gy: int, rng: random.Random) -> PlaqueSpot:
    d.line((cx - 100, gy + 2, cx + 100, gy + 2), fill=(70, 70, 70), width=4)
    d.rectangle((cx - 100, gy - 80, cx + 40, gy - 24), fill=c)
    d.rectangle((cx + 40, gy - 120, cx + 100, gy - 24), fill=shade(c, 0.8))
    d.rectangle((cx - 80, gy - 112, cx - 60, gy - 80), fill=(40, 40, 40))
    d.rectangle((cx + 54, gy - 108, cx + 86, gy - 84), fill=window_ink(c))
    for x in spread(n, cx - 82, cx + 82):
        _wheel(d, x, gy - 14, 14)
    return _badge(cx - 14, gy - 66)


@motif("ferry")
def _ferry(d: Draw, c: RGB, n: int, cx: int, gy: int, rng: random.Random) -> PlaqueSpot:
    d.rectangle((cx - 110, gy - 26, cx + 110, gy + 16), fill=(112, 140, 150))
    d.rectangle((cx - 50, gy - 108, cx + 40, gy - 72), fill=(244, 244, 240))
    d.rectangle((cx - 10, gy - 136, cx + 8, gy - 108), fill=(60, 60, 60))
    d.polygon([(cx - 100, gy - 72), (cx + 100, gy - 72), (cx + 80, gy - 14), (cx - 84, gy - 14)], fill=c)
    for x in spread(n, cx - 70, cx + 70):
        d.ellipse((x - 9, gy - 62, x + 9, gy - 44), fill=window_ink(c), outline=(30, 30, 30), width=2)
    return _badge(cx, gy - 40)


def _table_card(cx: int, gy: int) -> PlaqueSpot:
    """The dish's card stands on the table in front of it."""
    return cx + 76, gy + 34 - PLAQUE_H, gy + 40


@motif("platter")
def _platter(d: Draw, c: RGB, n: int, cx: int, gy: int, rng: random.Random) -> PlaqueSpot:
    d.ellipse((cx - 100, gy - 60, cx + 100, gy + 20), fill=c, outline=shade(c, 0.6), width=3)
    d.ellipse((cx - 76, gy - 46, cx + 76, gy + 6), fill=shade(c, 0.9))
    for k, x in enumerate(spread(n, cx - 62, cx + 62)):
        y = gy - 24 + (8 if k % 2 else -8)
        d.ellipse((x - 14, y - 12, x + 14, y + 12), fill=(242, 232, 206), outline=(150, 130, 100), width=2)
    return _table_card(cx, gy)


@motif("soup")
def _soup(d: Draw, c: RGB, n: int, cx: int, gy: int, rng: random.Random) -> PlaqueSpot:
    d.pieslice((cx - 100, gy - 130, cx + 100, gy + 20), 0, 180, fill=c)
    d.ellipse((cx - 100, gy - 76, cx + 100, gy - 34), fill=(196, 150, 90))
    for k, x in enumerate(spread(n, cx - 70, cx + 70)):
        y = gy - 55 + (5 if k % 2 else -5)
        d.ellipse((x - 11, y - 8, x + 11, y + 8), fill=(240, 170, 60), outline=(120, 70, 20), width=2)
    return _table_card(cx, gy)


@motif("cake")
def _cake(d: Draw, c: RGB, n: int, cx: int, gy: int, rng: random.Random) -> PlaqueSpot:
    d.rectangle((cx - 90, gy - 80, cx + 90, gy - 10), fill=c)
    d.ellipse((cx - 90, gy - 96, cx + 90, gy - 64), fill=mix(c, (255, 255, 255), 0.25))
    d.ellipse((cx - 90, gy - 26, cx + 90, gy + 6), fill=c)
    for x in spread(n, cx - 70, cx + 70):
        d.rectangle((x - 4, gy - 126, x + 4, gy - 82), fill=(240, 240, 236), outline=(90, 90, 90))
        d.ellipse((x - 5, gy - 140, x + 5, gy - 126), fill=(255, 170, 40))
    return _table_card(cx, gy)

"""The motif registry and the helpers motif drawers share.

A drawer is ``(draw, colour, n, cx, gy, rng) -> plaque spot or None``: it draws the entity's pictogram
with ``n`` countable parts, within ``cx +- 100`` horizontally and 190 pixels above the horizon ``gy``,
and returns where the plaque goes (None: the default spot on a stake in front of it).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from PIL.ImageDraw import ImageDraw as Draw

from ssr_lab.world.closed_sets import RGB
from ssr_lab.world.scene import contrast_ink, emblem

PlaqueSpot = tuple[int, int, int | None]  # (centre x, top y, stake bottom y or None)
Drawer = Callable[[Draw, RGB, int, int, int, random.Random], PlaqueSpot | None]
DRAWERS: dict[str, Drawer] = {}


def motif(name: str) -> Callable[[Drawer], Drawer]:
    def register(fn: Drawer) -> Drawer:
        DRAWERS[name] = fn
        return fn

    return register


def spread(n: int, lo: float, hi: float) -> list[int]:
    """``n`` evenly spaced positions between ``lo`` and ``hi`` (the middle one if n == 1)."""
    if n == 1:
        return [round((lo + hi) / 2)]
    return [round(lo + (hi - lo) * k / (n - 1)) for k in range(n)]


def emblem_star(d: Draw, x: int, y: int, r: int, fill: RGB) -> None:
    emblem(d, "star", x, y, r, fill)


def window_ink(c: RGB) -> RGB:
    """Windows and spots must stand out on the body: pale on dark colours, dark on light ones."""
    return (250, 236, 160) if contrast_ink(c)[0] > 128 else (40, 48, 66)

"""Shared drawing vocabulary for the demo pictures: canvas size, colours, the motif registry.

Motif modules register their drawing routines here by name (``Entity.motif``) so the renderer does not
need to know them, and so each module stays small.
"""

from __future__ import annotations

from collections.abc import Callable

from PIL import ImageDraw

from ssr_server.demo.entities import Entity

W, H = 448, 320  # drawing canvas; pictures are downsampled from it for smooth edges
RGB = tuple[int, int, int]
Drawer = Callable[[ImageDraw.ImageDraw, Entity, RGB, int, int], None]
"""A motif routine: (draw, entity, main colour, centre x, horizon y) -> None."""

DRAWERS: dict[str, Drawer] = {}


def motif(name: str) -> Callable[[Drawer], Drawer]:
    """Register a drawing routine under a motif name."""

    def register(fn: Drawer) -> Drawer:
        if name in DRAWERS:
            raise ValueError(f"motif {name!r} registered twice")
        DRAWERS[name] = fn
        return fn

    return register


def shade(c: RGB, f: float) -> RGB:
    """Darken (f < 1) or lighten (f > 1) a colour, clamped to the byte range."""
    return (min(255, int(c[0] * f)), min(255, int(c[1] * f)), min(255, int(c[2] * f)))


def frame(d: ImageDraw.ImageDraw, inner: RGB) -> tuple[int, int, int, int]:
    """Paintings fill most of the canvas inside a gilt frame; returns the inner box."""
    d.rectangle((40, 20, W - 40, H - 20), fill=(150, 110, 40))
    d.rectangle((58, 38, W - 58, H - 38), fill=inner)
    return 58, 38, W - 58, H - 38


def wheel(d: ImageDraw.ImageDraw, x: int, y: int, r: int) -> None:
    d.ellipse((x - r, y - r, x + r, y + r), fill=(25, 25, 25))
    d.ellipse((x - r // 2, y - r // 2, x + r // 2, y + r // 2), fill=(170, 170, 170))

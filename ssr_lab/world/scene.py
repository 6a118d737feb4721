"""The parts every picture shares: background, the big sign, the small plaque, the emblem shapes.

Pictures are drawn on a W x H canvas and downsampled by two, so edges come out smooth. Backgrounds are
muted (pale skies, dull grounds and walls) so that an entity's colour is never confused with them, and
vary a lot in coarse layout (horizon, hills, sun, clouds, ground pattern), which is what the perceptual
hashes of the image search look at. Everything a question asks about stays inside the central
``MARGIN`` band, so that the cropped views used as question images never cut it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import lru_cache

from PIL import ImageDraw, ImageFont

from ssr_lab.world.closed_sets import RGB

W, H = 448, 320
MARGIN = 36  # canvas pixels (8%): views crop at most 3% per side, so nothing asked about is cut
Box = tuple[int, int, int, int]

SKIES: tuple[RGB, ...] = ((172, 200, 222), (214, 200, 178), (190, 192, 206), (200, 214, 198),
                          (222, 204, 204), (152, 164, 186), (206, 214, 222), (184, 176, 160))
GROUNDS: tuple[RGB, ...] = ((118, 134, 96), (150, 130, 100), (110, 110, 116), (140, 118, 92),
                            (96, 116, 110), (128, 104, 110), (160, 150, 120), (88, 96, 80))
WALLS: tuple[RGB, ...] = ((200, 190, 170), (170, 180, 176), (190, 170, 160), (150, 150, 160),
                          (212, 206, 190), (160, 140, 120), (130, 140, 130), (184, 184, 196))
PATTERNS: tuple[str, ...] = ("plain", "stripes", "dots", "checks", "waves")


def shade(c: RGB, f: float) -> RGB:
    return (min(255, int(c[0] * f)), min(255, int(c[1] * f)), min(255, int(c[2] * f)))


def mix(a: RGB, b: RGB, t: float) -> RGB:
    return (round(a[0] + (b[0] - a[0]) * t), round(a[1] + (b[1] - a[1]) * t), round(a[2] + (b[2] - a[2]) * t))


def contrast_ink(c: RGB) -> RGB:
    """Black on light colours, white on dark ones."""
    return (20, 20, 20) if 0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2] > 110 else (245, 245, 245)


@lru_cache(maxsize=16)
def font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    return ImageFont.load_default(size=size)


def pattern(d: ImageDraw.ImageDraw, box: Box, kind: str, ink: RGB, rng: random.Random) -> None:
    """A pattern over ``box``: it makes pictures differ in texture, which dHash picks up."""
    x0, y0, x1, y1 = box
    step = rng.randint(18, 34)
    if kind == "stripes":
        for x in range(x0 + rng.randint(0, step), x1, step):
            d.rectangle((x, y0, x + step // 3, y1), fill=ink)
    elif kind == "dots":
        for y in range(y0 + step // 2, y1, step):
            for x in range(x0 + (step // 2 if (y // step) % 2 else 0), x1, step):
                d.ellipse((x - 4, y - 4, x + 4, y + 4), fill=ink)
    elif kind == "checks":
        for y in range(y0, y1, step):
            for x in range(x0 + ((y - y0) // step % 2) * step, x1, 2 * step):
                d.rectangle((x, y, x + step - 1, min(y1, y + step - 1)), fill=ink)
    elif kind == "waves":
        for y in range(y0 + step // 2, y1, step):
            d.line([(x, y + 5 * math.sin(x / 9)) for x in range(x0, x1 + 1, 6)], fill=ink, width=3)


def outdoor(d: ImageDraw.ImageDraw, rng: random.Random, gy: int) -> RGB:
    """Sky, sun, clouds, hills and a patterned ground below the horizon ``gy``; returns the sky."""
    top, bottom = rng.choice(SKIES), rng.choice(SKIES)
    for y in range(0, gy, 8):
        d.rectangle((0, y, W, y + 8), fill=mix(top, bottom, y / max(gy, 1)))
    sx, sy, sr = rng.randint(30, W - 30), rng.randint(20, 90), rng.randint(14, 40)
    d.ellipse((sx - sr, sy - sr, sx + sr, sy + sr), fill=rng.choice([(252, 236, 150), (250, 250, 240)]))
    for _ in range(rng.randint(0, 3)):
        cx, cy, cw = rng.randint(0, W), rng.randint(20, max(40, gy - 120)), rng.randint(30, 80)
        d.ellipse((cx - cw, cy - cw // 3, cx + cw, cy + cw // 3), fill=(236, 238, 240))
    ground = rng.choice(GROUNDS)
    for _ in range(rng.randint(1, 4)):
        hx, hw, hh = rng.randint(-60, W + 60), rng.randint(70, 230), rng.randint(25, 110)
        d.ellipse((hx - hw, gy - hh, hx + hw, gy + hh), fill=shade(ground, rng.uniform(0.6, 1.35)))
    d.rectangle((0, gy, W, H), fill=ground)
    pattern(d, (0, gy + 6, W, H), rng.choice(PATTERNS), shade(ground, 0.82), rng)
    return top


def indoor(d: ImageDraw.ImageDraw, rng: random.Random, gy: int) -> RGB:
    """A patterned wall above ``gy`` and a floor or table top below it; returns the wall colour."""
    wall, floor = rng.choice(WALLS), rng.choice(GROUNDS)
    d.rectangle((0, 0, W, gy), fill=wall)
    pattern(d, (0, 0, W, gy), rng.choice(PATTERNS), shade(wall, 0.88), rng)
    d.rectangle((0, gy, W, H), fill=floor)
    d.rectangle((0, gy, W, gy + 5), fill=shade(floor, 0.7))
    pattern(d, (0, gy + 8, W, H), rng.choice(PATTERNS), shade(floor, 0.85), rng)
    return wall


def emblem(d: ImageDraw.ImageDraw, shape: str, cx: int, cy: int, r: int, fill: RGB) -> None:
    """One of the closed set of shapes, about 2r across."""
    if shape == "circle":
        d.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill)
    elif shape == "square":
        d.rectangle((cx - r * 0.85, cy - r * 0.85, cx + r * 0.85, cy + r * 0.85), fill=fill)
    elif shape == "triangle":
        d.polygon([(cx, cy - r), (cx + r, cy + r * 0.8), (cx - r, cy + r * 0.8)], fill=fill)
    elif shape == "diamond":
        d.polygon([(cx, cy - r), (cx + r * 0.75, cy), (cx, cy + r), (cx - r * 0.75, cy)], fill=fill)
    elif shape == "star":
        pts = []
        for k in range(10):
            rad = r if k % 2 == 0 else r * 0.42
            a = -math.pi / 2 + k * math.pi / 5
            pts.append((cx + rad * math.cos(a), cy + rad * math.sin(a)))
        d.polygon(pts, fill=fill)
    elif shape == "hexagon":
        d.regular_polygon((cx, cy, r), 6, fill=fill)
    else:
        raise ValueError(f"unknown shape {shape!r}")


@dataclass(frozen=True)
class Sign:
    """What the big sign shows: a shape or one large character."""

    kind: str  # "shape" | "char"
    value: str


def big_sign(d: ImageDraw.ImageDraw, sign: Sign, x0: int, y0: int, post_to: int | None) -> Box:
    """A 76x76 white panel with a large black shape or character, optionally on a post down to
    ``post_to``; returns the panel's box."""
    size = 76
    if post_to is not None:
        d.rectangle((x0 + size // 2 - 4, y0 + size, x0 + size // 2 + 4, post_to), fill=(90, 70, 50))
    d.rectangle((x0, y0, x0 + size, y0 + size), fill=(250, 250, 246), outline=(40, 40, 40), width=3)
    cx, cy = x0 + size // 2, y0 + size // 2
    if sign.kind == "shape":
        emblem(d, sign.value, cx, cy, 28, (25, 25, 25))
    else:
        d.text((cx, cy), sign.value, fill=(20, 20, 20), font=font(64), anchor="mm")
    return x0, y0, x0 + size, y0 + size


PLAQUE_W, PLAQUE_H = 30, 28


def plaque(d: ImageDraw.ImageDraw, char: str, cx: int, top: int, stake_to: int | None) -> Box:
    """The small detail: a character about 20 canvas pixels high (10 in a question image), legible
    only once zoomed; returns the plaque's box."""
    x0, x1 = cx - PLAQUE_W // 2, cx + PLAQUE_W // 2
    if stake_to is not None:
        d.rectangle((cx - 2, top + PLAQUE_H, cx + 2, stake_to), fill=(80, 60, 40))
    d.rectangle((x0, top, x1, top + PLAQUE_H), fill=(252, 250, 236), outline=(30, 30, 30), width=2)
    d.text((cx, top + PLAQUE_H // 2 + 1), char, fill=(15, 15, 15), font=font(21), anchor="mm")
    return x0, top, x1, top + PLAQUE_H

"""Question images: perturbed views of an entity's canvas, so image search must match, not look up.

A view crops a little off each side (which also shifts and rescales the picture), jitters brightness,
contrast and colour balance, adds sensor noise and is saved as JPEG, like a photo of the same thing.
Perturbations are mild by design: colours keep their names, counts and characters stay inside the
picture (everything asked about lies within ``scene.MARGIN``), and the small plaque keeps its place,
which the view maps into 0-1000 coordinates for the zoom gold box.
"""

from __future__ import annotations

import hashlib
import io
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image

from ssr_lab.world.picture import PICTURE_SIZE
from ssr_lab.world.scene import Box, H, W

MAX_CROP = 0.03  # of each side; scene.MARGIN keeps everything that questions ask about further in
ZOOM_PAD = 0.4  # of the plaque's size, added around it: the plaque fills most of the zoomed crop


Crop = tuple[float, float, float, float]  # the canvas region a view shows, in canvas pixels


@dataclass(frozen=True)
class View:
    jpeg: bytes
    crop: Crop


def to_relative(crop: Crop, box: Box) -> tuple[float, float, float, float]:
    """A canvas box in a view's 0-1000 coordinates (may fall outside 0-1000)."""
    cl, ct, cr, cb = crop
    sx, sy = 1000 / (cr - cl), 1000 / (cb - ct)
    return (box[0] - cl) * sx, (box[1] - ct) * sy, (box[2] - cl) * sx, (box[3] - ct) * sy


def view_seed(*parts: int | str) -> int:
    """A 64-bit seed from any parts, independent of Python's hash randomisation."""
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:8], "big")


_NOISE_PAD = 32
# Sensor noise is sliced from one fixed bank at a random offset: drawing fresh normal deviates for every
# view costs more than everything else a view needs.
_NOISE = np.random.default_rng(0x5E2502).standard_normal(
    (PICTURE_SIZE[1] + _NOISE_PAD, PICTURE_SIZE[0] + _NOISE_PAD, 3), dtype=np.float32)


def make_view(half: Image.Image, seed: int) -> View:
    """A view of the half-size canvas (the index picture): cheaper to resample than the full canvas."""
    rng = np.random.default_rng(seed)
    left, right, top, bottom = (rng.uniform(0, MAX_CROP) for _ in range(4))
    crop = (left * W, top * H, W - right * W, H - bottom * H)
    half_box = (crop[0] / 2, crop[1] / 2, crop[2] / 2, crop[3] / 2)
    img = half.resize(PICTURE_SIZE, Image.Resampling.BILINEAR, box=half_box)
    arr = np.asarray(img, dtype=np.float32)
    mean = float(arr.mean())
    gain = rng.uniform(0.96, 1.04, size=3).astype(np.float32)  # colour balance
    contrast, brightness, sigma = rng.uniform(0.9, 1.1), rng.uniform(0.92, 1.08), rng.uniform(1.5, 4.0)
    oy, ox = (int(v) for v in rng.integers(0, _NOISE_PAD, size=2))
    # ((x - mean) * contrast + mean * brightness) * gain + noise, folded into one scale and one offset
    arr *= np.float32(contrast) * gain
    arr += np.float32(mean * (brightness - contrast) + 0.5) * gain
    arr += _NOISE[oy:oy + PICTURE_SIZE[1], ox:ox + PICTURE_SIZE[0]] * np.float32(sigma)
    out = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))
    buf = io.BytesIO()
    out.save(buf, format="JPEG", quality=int(rng.integers(82, 93)))
    return View(buf.getvalue(), crop)


def zoom_box(crop: Crop, plaque: Box, pad: float = ZOOM_PAD) -> tuple[int, int, int, int]:
    """The gold zoom box around the plaque (or another canvas box, ``pad`` times its size added on each
    side), integers in 0-1000 with x1 < x2 and y1 < y2."""
    x0, y0, x1, y1 = to_relative(crop, plaque)
    px, py = (x1 - x0) * pad, (y1 - y0) * pad
    box = (max(0, math.floor(x0 - px)), max(0, math.floor(y0 - py)),
           min(1000, math.ceil(x1 + px)), min(1000, math.ceil(y1 + py)))
    if not (box[0] < box[2] and box[1] < box[3]):
        raise ValueError(f"plaque {plaque} falls outside the view {crop}")
    return box


ZOOM_STYLES = ("tight", "strip", "wide", "coarse")
WIDE = 3  # a "wide" box is this many times the gold box's width


def check_zoom_style(style: str) -> str:
    """``style`` if it is one of ``ZOOM_STYLES``; ValueError otherwise."""
    if style not in ZOOM_STYLES:
        raise ValueError(f"zoom style {style!r} is not one of {', '.join(ZOOM_STYLES)}")
    return style


def styled_box(box: Sequence[int], style: str) -> tuple[int, int, int, int]:
    """The zoom box a trajectory writes for the gold ``box`` in a zoom ``style``.

    "tight" is the gold box. Trained models put the box's vertical centre within a few per mille of the
    plaque's but its horizontal centre a median 150 away (left-right place is what their towers do not
    tell): "strip" keeps the gold rows and spans the whole width, so it holds the plaque wherever it
    stands, at about half the tight crop's magnification (the zoom tool caps the crop's long side);
    "wide" keeps the rows and the centre and is ``WIDE`` times as wide (shifted to stay inside the
    picture), a middle way: it forgives a centre off by the gold width, at a third of the magnification.
    "coarse" is two calls (``coarse_boxes``) whose second crop shows the wide box: that box is returned."""
    check_zoom_style(style)
    x1, y1, x2, y2 = (int(v) for v in box)
    if style == "strip":
        return 0, y1, 1000, y2
    if style in ("wide", "coarse"):
        width = min(1000, WIDE * (x2 - x1))
        left = min(max(0, (x1 + x2) // 2 - width // 2), 1000 - width)
        return left, y1, left + width, y2
    return x1, y1, x2, y2


def coarse_boxes(box: Sequence[int]) -> tuple[tuple[int, int, int, int], tuple[int, int, int, int]]:
    """The two zoom calls of the "coarse" style for the gold ``box``: the strip (its rows across the whole
    width; the vertical centre is what trained models get right) on the picture, then, on that strip's
    crop, the wide box's columns over the crop's whole height. A strip spans the picture's width, so a
    column keeps its per mille; in the strip's crop the plaque is ~4 tokens wide against ~1 in the
    picture, which is where the horizontal place can be told."""
    x1, _, x2, _ = styled_box(box, "wide")
    return styled_box(box, "strip"), (x1, 0, x2, 1000)


def jitter_edges(box: Sequence[int], gold: Sequence[int], share: float, rng: random.Random,
                 min_side: int = 20) -> tuple[int, int, int, int]:
    """``box`` with each edge moved independently by up to ``share`` of the ``gold`` box's width (left,
    right) or height (top, bottom), inside the picture: a model's own box is never the styled box to the
    per mille, and the shipped model's reading flipped on crops 4 per mille lower (sixteenth session)."""
    gw, gh = gold[2] - gold[0], gold[3] - gold[1]
    x1, y1, x2, y2 = (round(v + rng.uniform(-share, share) * size)
                      for v, size in zip(box, (gw, gh, gw, gh), strict=True))
    x1, y1 = max(0, min(x1, 1000 - min_side)), max(0, min(y1, 1000 - min_side))
    return x1, y1, min(1000, max(x2, x1 + min_side)), min(1000, max(y2, y1 + min_side))


def shift_box(box: Sequence[int], dx: float) -> tuple[int, int, int, int]:
    """``box`` moved ``dx`` per mille to the right (left when negative), as far as it stays inside the
    picture."""
    x1, y1, x2, y2 = (int(v) for v in box)
    step = max(-x1, min(round(dx), 1000 - x2))
    return x1 + step, y1, x2 + step, y2

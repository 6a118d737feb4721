"""An entity's picture: background, motif, the big sign and the small plaque, deterministically.

``draw_canvas`` returns the full-resolution canvas and where the sign and plaque ended up; the index
picture is the canvas halved, question images are perturbed views of it (``views``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from PIL import Image, ImageDraw

from ssr_lab.world import motifs_indoor, motifs_outdoor
from ssr_lab.world.categories import MOTIF_CATEGORY
from ssr_lab.world.closed_sets import COLOURS
from ssr_lab.world.entities import Look
from ssr_lab.world.motif_kit import DRAWERS
from ssr_lab.world.scene import MARGIN, Box, H, W, big_sign, indoor, outdoor, plaque

PICTURE_SIZE = (W // 2, H // 2)  # the index pictures and the question images
SIGN_SIZE, MOTIF_HALF, GAP = 76, 100, 16
# Where a motif's ink lies around its centre x and the horizon (drawn in every colour, 20 looks of each
# motif: a tower's top 224 pixels up, a gate's or a flower's sides a few pixels past cx +- 100, nothing
# 40 pixels under the horizon): the zoom box of a count question (train sft --zoom-count)
MOTIF_TOP, MOTIF_BELOW, MOTIF_SIDE = 230, 40, 8
_MODULES = (motifs_indoor, motifs_outdoor)  # imported for their registrations
_INDOOR = frozenset({"artwork", "dish"})


@dataclass(frozen=True)
class Canvas:
    image: Image.Image  # W x H
    sign_box: Box
    plaque_box: Box
    motif_box: Box = (0, 0, W, H)  # the region the motif drawer may draw in (its contract, not its ink)


def _horizon(category: str, rng: random.Random) -> int:
    if category == "artwork":
        return rng.randint(236, 262)
    if category == "dish":
        return rng.randint(206, 244)
    return rng.randint(224, 262)


def draw_canvas(look: Look) -> Canvas:
    """The same look always gives the same pixels (one seeded RNG drives every random choice)."""
    drawer = DRAWERS.get(look.motif)
    if drawer is None:
        raise KeyError(f"unknown motif {look.motif!r}")
    category = MOTIF_CATEGORY[look.motif]
    rng = random.Random(look.scene_seed)
    img = Image.new("RGB", (W, H))
    d = ImageDraw.Draw(img)
    gy = _horizon(category, rng)
    (indoor if category in _INDOOR else outdoor)(d, rng, gy)
    offset = rng.randint(0, W - 2 * MARGIN - (SIGN_SIZE + GAP + 2 * MOTIF_HALF))
    if rng.random() < 0.5:  # sign on the left
        sign_x = MARGIN + offset
        cx = sign_x + SIGN_SIZE + GAP + MOTIF_HALF
    else:
        cx = MARGIN + offset + MOTIF_HALF
        sign_x = cx + MOTIF_HALF + GAP
    spot = drawer(d, COLOURS[look.colour], look.count, cx, gy, rng)
    if spot is None:  # default: on a stake in the ground in front of the motif
        spot = (cx + rng.choice((-1, 1)) * rng.randint(24, 64), gy + 6, gy + 44)
    if category == "artwork":
        sign_top, post_to = gy - 150 + rng.randint(0, 40), None
    else:
        sign_top, post_to = gy - SIGN_SIZE - rng.randint(28, 64), gy + 12
    sign_box = big_sign(d, look.sign, sign_x, sign_top, post_to)
    plaque_box = plaque(d, look.plaque, spot[0], spot[1], spot[2])
    motif_box = (max(0, cx - MOTIF_HALF - MOTIF_SIDE), max(0, gy - MOTIF_TOP),
                 min(W, cx + MOTIF_HALF + MOTIF_SIDE), min(H, gy + MOTIF_BELOW))
    return Canvas(img, sign_box, plaque_box, motif_box)


def index_picture(canvas: Canvas) -> Image.Image:
    """The canonical picture (index entry and search thumbnail): the canvas halved by box filtering."""
    return canvas.image.reduce(2)

"""Deterministic Pillow drawings of the demo entities.

Each picture is a seeded background (sky, ground, hills, sun; seeded by the entity id so the coarse
luminance layout that perceptual hashes look at differs between entities) plus a simple pictogram of
the entity in its palette colour. Pictures are drawn on a 448x320 canvas and downsampled, so edges are
smooth at the default 224x160.
"""

from __future__ import annotations

import hashlib
import random

from PIL import Image, ImageDraw, ImageFont

from ssr_server.demo import motifs_built, motifs_things
from ssr_server.demo.entities import PALETTE, Entity
from ssr_server.demo.shapes import DRAWERS, RGB, H, W, shade

_SKIES: tuple[RGB, ...] = ((135, 190, 235), (250, 215, 160), (40, 45, 80), (200, 220, 230), (170, 140, 200))
_GROUNDS: tuple[RGB, ...] = ((70, 120, 60), (190, 170, 120), (60, 90, 150), (110, 110, 110), (150, 90, 60))
_SELF_LABELLED = frozenset({"rocket", "tram"})  # motifs that paint the label themselves
_MODULES = (motifs_built, motifs_things)  # imported for their registrations


def draw_entity(entity: Entity) -> Image.Image:
    """The full-resolution (W x H) picture of one entity; the same entity always gives the same pixels."""
    drawer = DRAWERS.get(entity.motif)
    if drawer is None:
        raise KeyError(f"entity {entity.id!r} has unknown motif {entity.motif!r}")
    seed = int.from_bytes(hashlib.sha256(entity.id.encode()).digest()[:8], "big")
    rng = random.Random(seed)
    sky, ground = rng.choice(_SKIES), rng.choice(_GROUNDS)
    img = Image.new("RGB", (W, H), sky)
    d = ImageDraw.Draw(img)
    gy = rng.randint(230, 270)  # horizon height
    for _ in range(rng.randint(2, 4)):  # hills with random place, size and brightness
        hx, hw, hh = rng.randint(-50, W), rng.randint(80, 220), rng.randint(30, 110)
        d.ellipse((hx - hw, gy - hh, hx + hw, gy + hh), fill=shade(ground, rng.uniform(0.5, 1.4)))
    d.rectangle((0, gy, W, H), fill=ground)
    sx, sy, sr = rng.randint(20, W - 20), rng.randint(15, 80), rng.randint(14, 34)
    d.ellipse((sx - sr, sy - sr, sx + sr, sy + sr), fill=rng.choice([(255, 230, 90), (250, 250, 250)]))
    drawer(d, entity, PALETTE[entity.colour], W // 2 + rng.randint(-50, 50), gy)
    if entity.label and entity.motif not in _SELF_LABELLED:
        d.text((12, 10), entity.label, fill=(0, 0, 0), font=ImageFont.load_default(size=32))
    return img

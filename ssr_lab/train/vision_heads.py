"""What ``train vision``'s heads read, and the classes of each: the tables its recipe and its trainer share.

Apart from ``vision.py`` so that the recipe (``config/vision.py``) can name the heads it accepts without
importing the trainer, and the trainer's module holds training only.
"""

from __future__ import annotations

from ssr_lab.world.closed_sets import CHARS, COLOURS, COUNTS, SHAPES
from ssr_lab.world.entities import Look
from ssr_lab.world.knowledge import knowledge_entities

SIGNS: tuple[str, ...] = SHAPES + CHARS  # the big sign shows one shape or one character
LABELS: dict[str, tuple[str, ...]] = {"colour": tuple(sorted(COLOURS)), "count": tuple(map(str, COUNTS)),
                                      "sign": SIGNS, "plaque": CHARS}
KNOWN_LOOKS: dict[str, Look] = {e.id: e.look for e in knowledge_entities()}
PLACES = tuple(f"{i * 100}-{i * 100 + 99}" for i in range(10))  # per mille of the picture, as boxes are
EXTRA: dict[str, tuple[str, ...]] = {"count_mean": LABELS["count"], "known": ("unknown", *KNOWN_LOOKS),
                                     "plaque_x": PLACES, "plaque_y": PLACES, "sign_crop": SIGNS,
                                     "count_crop": LABELS["count"]}
HEADS: tuple[str, ...] = (*LABELS, *EXTRA)
# heads that read a zoom crop, and which: the plaque's (the ``crops``), or the crops at another zoom target
CROP_HEADS = {"plaque": "crops", "sign_crop": "sign", "count_crop": "motif"}


def place(centre: float) -> str:
    """The tenth of the picture (0-1000 coordinates) a box's centre lies in."""
    return PLACES[min(9, max(0, int(centre) // 100))]

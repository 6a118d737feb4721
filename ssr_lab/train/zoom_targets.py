"""What a zoom call looks at in a question picture, and the picture, gold box and crop drawn for it.

Three targets: the small plaque (detail questions), the big sign (sign questions under ``train sft``'s
``zoom_sign``) and the motif whose parts a count question counts (``zoom_count``). Each has its canvas
box; the gold zoom box is that box in the view's 0-1000 coordinates, padded around the plaque and the
sign (``views.ZOOM_PAD``) and not around the motif, whose box already holds every part of it. The motif
keeps the gold box in every zoom style: three times its width, or its rows across the picture, is the
whole picture again.
"""

from __future__ import annotations

import io
import random

from PIL import Image

from ssr_lab.world.entities import Look
from ssr_lab.world.picture import Canvas, draw_canvas, index_picture
from ssr_lab.world.records import Question
from ssr_lab.world.scene import Box as CanvasBox
from ssr_lab.world.views import ZOOM_PAD, Crop, jitter_edges, make_view, shift_box, styled_box, zoom_box
from ssr_server.tools.zoom import zoom_crop

TARGETS = ("plaque", "sign", "motif")
TARGET_OF = {"shape": "sign", "char": "sign", "count": "motif"}  # a zooming visual question's target
Box = tuple[int, int, int, int]  # a zoom box, 0-1000 of the picture


def check_target(target: str) -> str:
    if target not in TARGETS:
        raise ValueError(f"zoom target {target!r} is not one of {', '.join(TARGETS)}")
    return target


def zoom_target(q: Question) -> str | None:
    """What a question's zoom looks at: the plaque for a detail question, the sign or the motif for a
    visual one about them (``train sft``'s ``zoom_sign``/``zoom_count``); None for the others."""
    if q.kind == "detail":
        return "plaque"
    return TARGET_OF.get(q.attribute) if q.kind == "visual" else None


def canvas_box(canvas: Canvas, target: str) -> CanvasBox:
    return {"plaque": canvas.plaque_box, "sign": canvas.sign_box,
            "motif": canvas.motif_box}[check_target(target)]


def target_style(target: str, zoom: str) -> str:
    """The zoom style a ``target``'s box is written in when trajectories use ``zoom``."""
    return "tight" if check_target(target) == "motif" else zoom


def gold_box(crop: Crop, canvas: Canvas, target: str) -> Box:
    """The gold zoom box around ``target`` in a view showing ``crop`` of ``canvas``; ValueError when the
    target fell outside the view."""
    return zoom_box(crop, canvas_box(canvas, target), 0.0 if target == "motif" else ZOOM_PAD)


def draw_view(look: Look, rng: random.Random) -> tuple[Image.Image, Crop, Canvas]:
    """A question image of ``look`` (its pixels as decoded), the canvas region it shows and the canvas."""
    canvas = draw_canvas(look)
    view = make_view(index_picture(canvas), rng.getrandbits(63))
    with Image.open(io.BytesIO(view.jpeg)) as decoded:
        return decoded.convert("RGB"), view.crop, canvas


def crop_of(picture: Image.Image, crop: Crop, canvas: Canvas, target: str, rng: random.Random,
            zoom: str = "tight", jitter: float = 0.0,
            edge_jitter: float = 0.0) -> tuple[Box, Image.Image] | None:
    """The gold zoom box around ``target`` in a view (``crop``: the canvas region it shows) and the zoom
    tool's crop of ``picture`` at it, styled (``target_style``) and jittered as ``question_picture`` says;
    None when the target fell outside the view. The motif's crop is not jittered: a box off by its width
    would miss it whole, which no model's box does."""
    try:
        box = gold_box(crop, canvas, target)
    except ValueError:
        return None
    crop_box = styled_box(box, target_style(target, zoom))
    if jitter > 0 and target != "motif":  # no draw at 0: old commands see old pictures
        crop_box = shift_box(crop_box, rng.uniform(-jitter, jitter) * (box[2] - box[0]))
    if edge_jitter > 0 and target != "motif":
        crop_box = jitter_edges(crop_box, box, edge_jitter, rng)
    return box, zoom_crop(picture, crop_box)


def question_picture(look: Look, rng: random.Random, zoom: str = "tight", jitter: float = 0.0,
                     target: str = "plaque",
                     edge_jitter: float = 0.0) -> tuple[Image.Image, Box, Image.Image] | None:
    """A question image of ``look`` as the world draws one (a perturbed view of its picture), the gold zoom
    box around its ``target`` (the plaque by default) and the zoom tool's crop at that box in the ``zoom``
    style (``views.styled_box``); None when the target fell outside the view.

    ``jitter`` moves the crop (not the box returned) sideways by up to that many gold-box widths: a trained
    model's box is off the plaque's centre by about one gold width (R19: a median ~150 per mille), so its
    crops show the plaque near an edge, often cut, while crops drawn at the styled box show it centred.
    ``edge_jitter`` then moves each edge of the crop by up to that share of the gold box's size
    (``views.jitter_edges``): other heights, rows and scales, as a model's boxes have."""
    check_target(target)
    picture, crop, canvas = draw_view(look, rng)
    zoomed = crop_of(picture, crop, canvas, target, rng, zoom, jitter, edge_jitter)
    return None if zoomed is None else (picture, *zoomed)

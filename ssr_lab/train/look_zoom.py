"""``train sft``'s ``zoom_sign``, ``zoom_count``: visual questions trained as zoom-then-read, as the plaque's.

The world's visual questions about the big sign (its shape or character) and the count of a motif's parts
are answered from the question image alone, and that is the gold a larger model meets. Our tiny model
cannot: the 76-pixel sign is 38 pixels in a 224x160 question image, a handful of its 35 merged tokens,
and the tower reads it at 35-40% on fresh pictures (the count at 44%), while the plaque's far smaller
character, read from the zoom tool's crop, reaches 90%. With these options the training split's sign
(count) questions first zoom on the sign (the motif), with the gold box (``zoom_targets.gold_box``) and
the label "big sign" (the counted parts' noun), and then answer from the image. The world is not changed:
its questions and gold moves stay as built, and a model so trained takes one more turn on those
questions (the evaluation scores the answer; its move accuracy counts the zoom as a wrong first move).

The gold box needs the view's crop of the canvas, which the world does not store: the view is drawn
again from its seed (``world.render``) for each attempt the build may have made, and the one whose
pixels are the question image's is taken.
"""

from __future__ import annotations

import io
import json
from collections.abc import Collection, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
from PIL import Image

from ssr_lab.train.zoom_targets import check_target, gold_box, target_style, zoom_target
from ssr_lab.world.build import MAX_VIEW_ATTEMPTS
from ssr_lab.world.categories import MOTIFS
from ssr_lab.world.entities import Entity, Look
from ssr_lab.world.picture import draw_canvas, index_picture
from ssr_lab.world.records import MOVE_ACTIONS, ZOOM, Move, Question, WorldError
from ssr_lab.world.views import Crop, make_view, styled_box, view_seed

SIGN_LABEL = "big sign"
SIGN_ATTRIBUTES = ("shape", "char")  # what a sign question asks; `train sft`'s `zoom_sign_on` picks some
SAME_PIXELS = 2.0  # mean absolute difference (0-255) under which a redrawn view is the question image


def zoom_label(look: Look, target: str) -> str:
    return SIGN_LABEL if target == "sign" else MOTIFS[look.motif].count_noun


def view_crop(world: Path, seed: int, q: Question, picture: Image.Image) -> Crop:
    """The canvas region question ``q``'s image shows (``views.View.crop``), found by drawing the view
    again for each build attempt: the same bytes, or (another JPEG library) the same pixels."""
    name = q.image.removeprefix("views/").removesuffix(".jpg")
    data = (world / q.image).read_bytes()
    target: np.ndarray | None = None  # decoded only when the bytes differ
    for attempt in range(MAX_VIEW_ATTEMPTS):
        view = make_view(picture, view_seed(seed, name, attempt))
        if view.jpeg == data:
            return view.crop
        if target is None:
            target = _pixels(data)
        drawn = _pixels(view.jpeg)
        if drawn.shape == target.shape and float(np.abs(drawn - target).mean()) < SAME_PIXELS:
            return view.crop
    raise WorldError(f"{q.image} is none of the views its seed draws: was {world} built by this code?")


def _pixels(jpeg: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(jpeg)) as img:
        return np.asarray(img.convert("RGB"), dtype=np.float32)


def zoom_looks(world: Path, questions: Sequence[Question], entities: Sequence[Entity],
               targets: Sequence[str], style: str = "tight",
               sign_attributes: Collection[str] = SIGN_ATTRIBUTES) -> list[Question]:
    """``questions`` with the moves of every visual question whose target is among ``targets`` (for the
    sign: whose attribute is among ``sign_attributes``) preceded by a zoom on it (the gold box in 0-1000
    of the question image, in the zoom ``style`` as ``zoom_targets.target_style`` says); the others as
    they are."""
    wanted = {check_target(t) for t in targets}
    seed = int(json.loads((world / "manifest.json").read_text(encoding="utf-8"))["seed"])
    looks = {e.id: e.look for e in entities}
    out: list[Question] = []
    for q in questions:
        target = zoom_target(q)
        if (target not in wanted or target is None or any(m.action == "zoom" for m in q.moves)
                or (target == "sign" and q.attribute not in sign_attributes)):
            out.append(q)
            continue
        look = looks.get(q.entity_id)
        if look is None:
            raise WorldError(f"question {q.id} is about {q.entity_id}, which {world} does not hold")
        canvas = draw_canvas(look)
        gold = gold_box(view_crop(world, seed, q, index_picture(canvas)), canvas, target)
        box = styled_box(gold, target_style(target, style))
        zoom = Move(ZOOM, MOVE_ACTIONS[ZOOM], box=list(box), label=zoom_label(look, target))
        out.append(replace(q, moves=[zoom, *q.moves]))
    return out

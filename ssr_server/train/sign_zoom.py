"""``train sft --zoom-sign``: the big sign's questions trained as zoom-then-read, like the plaque's.

The world's visual questions about the big sign (its shape or character) are answered from the question
image alone, and that is the gold a larger model meets. Our tiny model cannot: the 76-pixel sign is 38
pixels in a 224x160 question image, a handful of 32-pixel merged tokens, and its tower reads it at
35-40% on fresh pictures, while the plaque's character, read from the zoom tool's crop, reaches 90%.
With this option the training split's sign questions first zoom on the sign (label "big sign", the gold
box around the sign in the question image, padded as the plaque's is) and then answer from the image.
The world is not changed: its questions and their gold moves stay as built, and a model trained so simply
takes one more turn on those questions (the evaluation scores the answer; its move accuracy then counts
the zoom as a wrong first move).

The gold box needs the view's crop of the canvas, which the world does not store: the view is drawn
again from its seed (``world.render``) for each attempt the build may have made, and the one whose
pixels are the question image's is taken.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
from PIL import Image

from ssr_server.world.build import MAX_VIEW_ATTEMPTS
from ssr_server.world.entities import Entity
from ssr_server.world.picture import draw_canvas, index_picture
from ssr_server.world.records import MOVE_ACTIONS, ZOOM, Move, Question, WorldError
from ssr_server.world.views import Crop, make_view, view_seed, zoom_box

SIGN_ASPECTS = ("shape", "char")
SIGN_LABEL = "big sign"
SAME_PIXELS = 2.0  # mean absolute difference (0-255) under which a redrawn view is the question image


def is_sign_question(q: Question) -> bool:
    return q.kind == "visual" and q.attribute in SIGN_ASPECTS


def view_crop(world: Path, seed: int, q: Question, picture: Image.Image) -> Crop:
    """The canvas region question ``q``'s image shows (``views.View.crop``), found by drawing the view
    again for each build attempt: the same bytes, or (another JPEG library) the same pixels."""
    name = q.image.removeprefix("views/").removesuffix(".jpg")
    data = (world / q.image).read_bytes()
    with Image.open(io.BytesIO(data)) as img:
        target = np.asarray(img.convert("RGB"), dtype=np.float32)
    for attempt in range(MAX_VIEW_ATTEMPTS):
        view = make_view(picture, view_seed(seed, name, attempt))
        if view.jpeg == data:
            return view.crop
        with Image.open(io.BytesIO(view.jpeg)) as img:
            drawn = np.asarray(img.convert("RGB"), dtype=np.float32)
        if drawn.shape == target.shape and float(np.abs(drawn - target).mean()) < SAME_PIXELS:
            return view.crop
    raise WorldError(f"{q.image} is none of the views its seed draws: was {world} built by this code?")


def zoom_signs(world: Path, questions: Sequence[Question], entities: Sequence[Entity]) -> list[Question]:
    """``questions`` with every sign question's moves preceded by a zoom on the sign (gold box, in 0-1000
    of the question image); the others as they are."""
    seed = int(json.loads((world / "manifest.json").read_text(encoding="utf-8"))["seed"])
    looks = {e.id: e.look for e in entities}
    out: list[Question] = []
    for q in questions:
        if not is_sign_question(q) or any(m.action == "zoom" for m in q.moves):
            out.append(q)
            continue
        look = looks.get(q.entity_id)
        if look is None:
            raise WorldError(f"question {q.id} is about {q.entity_id}, which {world} does not hold")
        canvas = draw_canvas(look)
        box = zoom_box(view_crop(world, seed, q, index_picture(canvas)), canvas.sign_box)
        zoom = Move(ZOOM, MOVE_ACTIONS[ZOOM], box=list(box), label=SIGN_LABEL)
        out.append(replace(q, moves=[zoom, *q.moves]))
    return out

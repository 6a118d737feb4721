"""Picture drills for SFT: the training split's visual and detail trajectories with a freshly drawn picture.

Our tiny models' vision towers start from scratch and learn only through the answers of the trajectories:
one answer token per picture question, each training picture seen a few times. The shipped model answered
test colour questions 0/9 and count questions 0/15, the same few values whatever the picture: it learnt
the answers' priors, not to look. A picture drill keeps a training trajectory token for token but draws a
new look of the same motif (colour, count, sign, plaque and scene all redrawn) exactly as the world draws
question images (canvas, perturbed view; for a detail question the zoom tool's crop around the plaque,
with the zoom call's box rewritten to match the new view) and writes the new look's answer: an unlimited
supply of pictures, in which only the picture tells the answer. The loss stays on the assistant's turns.

The first move of a question about a pictured entity also rests on the picture alone: a well-known
entity is answered from general knowledge, any other is searched by image (the shipped model chose
wrongly for 25 of 40 test search questions). Move drills cut a search, two-hop or knowledge trajectory
after its first assistant turn and show a new picture: a fresh view of the same well-known entity (the
move and answer stand), or a new look of the searched entity's motif (an entity never seen: search).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from PIL import Image

from ssr_lab.train.data import Example, occurrences, png
from ssr_lab.train.look_search import searched
from ssr_lab.train.zoom_retry import assistant_spans, miss_box, missed_zoom
from ssr_lab.train.zoom_targets import Box, question_picture, target_style, zoom_target
from ssr_lab.world.closed_sets import CHARS, SHAPES
from ssr_lab.world.closed_sets import char_kind as _kind
from ssr_lab.world.entities import Entity, Look, draw_look
from ssr_lab.world.records import Question
from ssr_lab.world.scene import Sign
from ssr_lab.world.views import coarse_boxes, styled_box
from ssr_server.core.formats.format import PromptFormat
from ssr_server.tools.zoom import zoom_crop

ASPECTS = ("colour", "count", "shape", "char", "plaque")  # what a visual or detail question reads
KNOWN, UNKNOWN = "known", "unknown"  # move drills: the same well-known entity / a never-seen look


@dataclass(frozen=True)
class PictureSource:
    example: Example
    motif: str
    aspect: str  # one of ASPECTS, KNOWN or UNKNOWN
    answer: tuple[int, ...] | None  # reading: the answer action's tokens (<answer>purple</answer>)
    box: tuple[int, ...] | None  # detail: the zoom call's box numbers' tokens ("496, 735, 621, 897")
    look: Look | None = None  # KNOWN: the well-known entity's look, drawn in a fresh view
    char_kind: str | None = None  # char: "number" or "letter", as the question asks
    target: str = "plaque"  # what the zoom call (``box``) looks at (zoom_targets.TARGETS)
    inner: tuple[int, ...] | None = None  # the "coarse" style's second zoom call (on the strip's crop)


def _swap(ids: list[int], mask: list[bool], old: Sequence[int], new: Sequence[int]) -> tuple[int, int]:
    """Replace the one occurrence of ``old`` (checked when the source was made) by ``new``, in place;
    returns where ``new`` now is."""
    at = occurrences(ids, old)[0]
    flag = mask[at]
    ids[at : at + len(old)] = list(new)
    mask[at : at + len(old)] = [flag] * len(new)
    return at, at + len(new)


def new_look(rng: random.Random, motif: str, aspect: str, char_kind: str | None = None) -> Look:
    """A random look of ``motif`` whose big sign shows a ``aspect`` when the question asks for one
    (``UNKNOWN``: any look); for a ``char`` question, a character of the ``char_kind`` its text names
    ("number" or "letter": a question asking for a letter must never be answered with a digit)."""
    look = draw_look(rng, motif)
    if aspect in ("shape", "char"):
        pool = SHAPES if aspect == "shape" else tuple(c for c in CHARS if char_kind in (None, _kind(c)))
        if look.sign.kind != aspect or look.sign.value not in pool:
            look = replace(look, sign=Sign(aspect, rng.choice(pool)))
    return look


def answer_of(look: Look, aspect: str) -> str:
    """The gold answer a question about ``aspect`` has for ``look`` (as ``world.questions`` writes it)."""
    return {"colour": look.colour, "count": str(look.count), "shape": look.sign.value,
            "char": look.sign.value, "plaque": look.plaque}[aspect]


def _first_move(ex: Example, e: Entity, image_pad: int) -> PictureSource | None:
    """``ex`` up to the end of its first assistant turn, as a move drill; None unless exactly one
    picture (the question's) comes before that turn."""
    try:
        first = ex.mask.index(True)
    except ValueError:
        return None
    end = first
    while end < len(ex.mask) and ex.mask[end]:
        end += 1
    if sum(1 for i in ex.ids[:first] if i == image_pad) != 1:
        return None
    cut = Example(ex.key, ex.kind, ex.ids[:end], ex.mask[:end], ex.images[:1])
    return PictureSource(cut, e.look.motif, KNOWN if e.knowledge else UNKNOWN, None, None,
                         e.look if e.knowledge else None)


class PictureDrills:
    """Sources (reading: visual and detail trajectories; moves: first turns of pictured questions) and the
    drawing of drills."""

    def __init__(self, sources: Sequence[PictureSource], tok: Any, fmt: PromptFormat,
                 zoom: str = "tight", zoom_jitter: float = 0.0, zoom_edge_jitter: float = 0.0,
                 zoom_retry: float = 0.0) -> None:
        self.sources = list(sources)
        self.tok = tok
        self.fmt = fmt
        self.zoom = zoom  # the zoom style of the sources' boxes, which drills keep
        self.zoom_jitter = zoom_jitter  # drills' crops move sideways (question_picture): off-centre reading
        self.zoom_edge_jitter = zoom_edge_jitter  # and each crop edge by up to this share of the gold size
        self.zoom_retry = zoom_retry  # share of plaque drills whose first zoom misses (zoom_retry.py)
        seen = fmt.observations.zoom.split("{placeholder}")[0].rstrip()
        self._seen = (self._enc(seen.format(index=1)), self._enc(seen.format(index=2)))

    def _enc(self, text: str) -> tuple[int, ...]:
        return tuple(self.tok.encode(text, add_special_tokens=False))

    def _answer(self, value: str) -> tuple[int, ...]:
        return self._enc(self.fmt.actions.answer.open + value + self.fmt.actions.answer.close)

    @classmethod
    def of(cls, examples: Sequence[Example], questions: Sequence[Question], entities: Sequence[Entity],
           tok: Any, fmt: PromptFormat, *, moves: bool = True, zoom: str = "tight",
           zoom_jitter: float = 0.0, zoom_edge_jitter: float = 0.0, zoom_retry: float = 0.0) -> PictureDrills:
        """The sources among ``examples``: visual and detail trajectories (one image, or the question's
        and the zoomed crop) in which the answer and, for detail, the zoom box occur exactly once; with
        ``moves``, the first turns of search, two-hop and knowledge trajectories too. ``questions``' zoom
        boxes are in the ``zoom`` style (``setup.zoom_styled``), as the examples' are."""
        by_id = {q.id: q for q in questions}
        by_entity = {e.id: e for e in entities}
        drills = cls([], tok, fmt, zoom, zoom_jitter, zoom_edge_jitter, zoom_retry)
        image_pad = int(tok.convert_tokens_to_ids("<|image_pad|>"))
        for ex in examples:
            q = by_id.get(ex.key.split("/", 1)[0])
            e = by_entity.get(q.entity_id) if q is not None else None
            if q is None or e is None or not ex.images:
                continue
            if searched(q):  # the answer comes from the search's description, not from the picture
                continue
            if q.kind in ("visual", "detail") and q.attribute in ASPECTS:
                source = drills._reading(ex, q, e)
            elif moves and q.kind in ("search", "two_hop", "knowledge"):
                source = _first_move(ex, e, image_pad)
            else:
                continue
            if source is not None:
                drills.sources.append(source)
        return drills

    def _reading(self, ex: Example, q: Question, e: Entity) -> PictureSource | None:
        # detail (two calls in the coarse style); a sign or motif under zoom_sign / zoom_count
        zooms = [m for m in q.moves if m.action == "zoom"]
        if len(ex.images) != 1 + len(zooms) or len(zooms) > 2 or not all(m.box for m in zooms):
            return None
        answer = self._answer(q.answer)
        boxes = [self._box(m.box) for m in zooms]
        if len(occurrences(ex.ids, answer)) != 1 or any(len(occurrences(ex.ids, b)) != 1 for b in boxes):
            return None
        kind = _kind(q.answer) if q.attribute == "char" else None
        return PictureSource(ex, e.look.motif, q.attribute, answer, boxes[0] if boxes else None,
                             char_kind=kind, target=zoom_target(q) or "plaque",
                             inner=boxes[1] if len(boxes) == 2 else None)

    def _box(self, box: Sequence[int]) -> tuple[int, ...]:
        return self._enc(", ".join(str(int(v)) for v in box))

    def drill(self, source: PictureSource, rng: random.Random) -> Example:
        """``source`` with a new picture and, for a reading drill, the new answer (and zoom box)."""
        for _ in range(8):  # a plaque can (rarely) fall outside a view: draw again
            look = source.look
            if look is None:
                look = new_look(rng, source.motif, source.aspect, source.char_kind)
            drawn = question_picture(look, rng, self.zoom, self.zoom_jitter, source.target,
                                     self.zoom_edge_jitter)
            if drawn is not None:
                break
        else:
            raise RuntimeError(f"no view of motif {source.motif!r} keeps its {source.target} in 8 draws")
        picture, box, crop = drawn
        ids, mask = list(source.example.ids), list(source.example.mask)
        images: tuple[bytes, ...] = (png(picture, compress_level=1),)
        learnt: list[tuple[int, int]] = []  # what the new picture decides
        if source.box is not None and source.inner is not None:  # coarse: the strip, then the wide box in it
            strip, inner = coarse_boxes(box)
            learnt.append(_swap(ids, mask, source.box, self._box(strip)))
            learnt.append(_swap(ids, mask, source.inner, self._box(inner)))
            # the last crop is the picture's at the wide box (question_picture), not a crop of the strip's
            # upscaled crop as the tool makes it: the same pixels, resampled once instead of twice
            images += (png(zoom_crop(picture, strip), compress_level=1), png(crop, compress_level=1))
        elif source.box is not None:  # the zoom call comes before the answer
            written = styled_box(box, target_style(source.target, self.zoom))
            learnt.append(_swap(ids, mask, source.box, self._box(written)))
            images += (png(crop, compress_level=1),)
        if source.answer is not None:
            learnt.append(_swap(ids, mask, source.answer, self._answer(answer_of(look, source.aspect))))
            if self.zoom_retry > 0 and source.target == "plaque" and source.box is not None \
                    and source.inner is None:  # no draw without retries: old commands see old drills
                return self._retry(source, ids, mask, images, picture, box, written, learnt[0], rng)
            # A reading drill's loss is on the answer (and box) only: the rationale and the tags are
            # learnt already, and averaged over ~65 such tokens the answer's gradient was ~1/65 of a
            # trajectory batch's under the same Adam statistics.
            mask = [False] * len(ids)
            for a, b in learnt:
                mask[a:b] = [True] * (b - a)
        return Example(source.example.key + "/picture", source.example.kind, tuple(ids), tuple(mask), images)

    def _retry(self, source: PictureSource, ids: list[int], mask: list[bool], images: tuple[bytes, ...],
               picture: Image.Image, gold: Box, written: Box, box_span: tuple[int, int],
               rng: random.Random) -> Example:
        """A plaque drill under ``zoom_retry``: with that chance its first zoom misses (``zoom_retry.py``);
        either way the loss also covers the turns after the crop, which now decide whether to zoom again."""
        miss = miss_box(written, gold, rng) if rng.random() < self.zoom_retry else None
        key = source.example.key + "/picture"
        if miss is not None and (spliced := missed_zoom(ids, mask, self._box(written), self._box(miss),
                                                        self._seen)) is not None:
            images = (images[0], png(zoom_crop(picture, miss), compress_level=1), images[1])
            return Example(key + "/retry", source.example.kind, tuple(spliced[0]), tuple(spliced[1]), images)
        last = assistant_spans(mask)[-1]
        learnt = [False] * len(ids)
        for a, b in (box_span, last):
            learnt[a:b] = [True] * (b - a)
        return Example(key, source.example.kind, tuple(ids), tuple(learnt), images)

    def draw(self, n: int, rng: random.Random) -> list[Example]:
        """``n`` drills of sources drawn uniformly (with replacement), each with a fresh look."""
        if not self.sources:
            return []
        return [self.drill(rng.choice(self.sources), rng) for _ in range(n)]

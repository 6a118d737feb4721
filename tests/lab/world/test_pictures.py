"""Pictures: deterministic, everything asked about inside the band views never crop, zoom boxes on the
plaque."""

from __future__ import annotations

import io
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageChops

from ssr_lab.world import Question
from ssr_lab.world.categories import MOTIFS
from ssr_lab.world.closed_sets import CHARS, COLOURS, SHAPES
from ssr_lab.world.entities import Look
from ssr_lab.world.picture import PICTURE_SIZE, draw_canvas
from ssr_lab.world.scene import MARGIN, H, Sign, W
from ssr_lab.world.views import MAX_CROP, jitter_edges, make_view, shift_box, styled_box, zoom_box
from ssr_server.tools.zoom import output_size, pixel_box


def _looks(motif: str, n: int = 12) -> list[Look]:
    rng = random.Random(motif)
    return [Look(motif, rng.choice(sorted(COLOURS)), rng.randint(MOTIFS[motif].min_count, 6),
                 Sign("shape", rng.choice(SHAPES)) if k % 2 else Sign("char", rng.choice(CHARS)),
                 rng.choice(CHARS), rng.getrandbits(63)) for k in range(n)]


def _inside(box: tuple[int, int, int, int]) -> bool:
    x_ok = box[0] >= MARGIN and box[2] <= W - MARGIN
    return x_ok and box[1] > H * MAX_CROP and box[3] < H * (1 - MAX_CROP)


@pytest.mark.parametrize("motif", sorted(MOTIFS))
def test_sign_and_plaque_stay_clear_of_the_cropped_border(motif: str) -> None:
    for look in _looks(motif):
        canvas = draw_canvas(look)
        assert _inside(canvas.sign_box) and _inside(canvas.plaque_box), (look, canvas)
        s, p = canvas.sign_box, canvas.plaque_box
        assert s[2] <= p[0] or p[2] <= s[0] or s[3] <= p[1] or p[3] <= s[1]  # they never overlap


@pytest.mark.parametrize("motif", sorted(MOTIFS))
def test_the_motif_box_holds_all_of_the_motifs_ink(motif: str) -> None:
    """What changes with the entity's colour (body, parts, their ink) lies inside ``motif_box``, the box a
    count question's zoom takes (``train sft --zoom-count``)."""
    for look in _looks(motif, 6):
        other = next(c for c in sorted(COLOURS) if c != look.colour and c not in ("white", "black"))
        canvas = draw_canvas(look)
        recoloured = draw_canvas(replace(look, colour=other)).image
        changed = ImageChops.difference(canvas.image, recoloured).getbbox()
        m = canvas.motif_box
        assert changed is not None and m[0] <= changed[0] and m[1] <= changed[1], (look, changed, m)
        assert changed[2] <= m[2] and changed[3] <= m[3], (look, changed, m)
        assert (m[2] - m[0]) * (m[3] - m[1]) < W * H / 2  # a zoom into it still magnifies


def test_drawing_is_deterministic_and_looks_differ() -> None:
    look = _looks("bridge", 2)
    a, b = draw_canvas(look[0]).image, draw_canvas(look[0]).image
    assert a.size == (W, H) and a.tobytes() == b.tobytes()
    assert draw_canvas(look[1]).image.tobytes() != a.tobytes()
    view = make_view(a.reduce(2), 7)
    assert view.jpeg == make_view(a.reduce(2), 7).jpeg != make_view(a.reduce(2), 8).jpeg
    with Image.open(io.BytesIO(view.jpeg)) as img:
        assert img.size == PICTURE_SIZE


def test_zoom_box_frames_the_plaque() -> None:
    for motif in sorted(MOTIFS):
        for look in _looks(motif, 3):
            canvas = draw_canvas(look)
            view = make_view(canvas.image.reduce(2), look.scene_seed)
            x1, y1, x2, y2 = zoom_box(view.crop, canvas.plaque_box)
            cl, ct, cr, cb = view.crop
            px1, py1, px2, py2 = canvas.plaque_box
            rel = ((px1 - cl) * 1000 / (cr - cl), (py1 - ct) * 1000 / (cb - ct),
                   (px2 - cl) * 1000 / (cr - cl), (py2 - ct) * 1000 / (cb - ct))
            assert x1 <= rel[0] < rel[2] <= x2 and y1 <= rel[1] < rel[3] <= y2
            area = (rel[2] - rel[0]) * (rel[3] - rel[1]) / ((x2 - x1) * (y2 - y1))
            assert area > 0.25  # the plaque fills a good part of the zoomed crop


def test_zoomed_crops_of_detail_questions_show_the_plaque(world_root: Path,
                                                          questions: list[Question]) -> None:
    """The centre of the gold crop is the plaque's pale card with a dark character on it."""
    for q in questions:
        if q.kind != "detail":
            continue
        with Image.open(world_root / q.image) as img:
            crop = img.convert("RGB").crop(pixel_box(tuple(q.moves[0].box), img.width, img.height))  # type: ignore[arg-type]
        crop = crop.resize(output_size(crop.width, crop.height, 224, 1024))
        grey = np.asarray(crop.convert("L"), dtype=np.float32)
        h, w = grey.shape
        centre = grey[h // 4: 3 * h // 4, w // 4: 3 * w // 4]
        assert np.median(centre) > 170 and centre.min() < 90, q.id


def test_strip_and_wide_keep_the_gold_boxs_rows_and_widen_it() -> None:
    assert styled_box([412, 705, 537, 868], "strip") == (0, 705, 1000, 868)
    assert styled_box([412, 705, 537, 868], "tight") == (412, 705, 537, 868)
    assert styled_box([412, 705, 537, 868], "wide") == (287, 705, 662, 868)  # 3x as wide, same centre
    assert styled_box([10, 705, 135, 868], "wide") == (0, 705, 375, 868)  # shifted inside the picture
    assert styled_box([900, 705, 1000, 868], "wide") == (700, 705, 1000, 868)
    with pytest.raises(ValueError, match="zoom style 'huge'"):
        styled_box([412, 705, 537, 868], "huge")


def test_a_shifted_box_keeps_its_rows_and_width_and_stays_inside_the_picture() -> None:
    assert shift_box([287, 705, 662, 868], 120.4) == (407, 705, 782, 868)
    assert shift_box([287, 705, 662, 868], -99.6) == (187, 705, 562, 868)
    assert shift_box([287, 705, 662, 868], 500) == (625, 705, 1000, 868)  # stopped at the right edge
    assert shift_box([287, 705, 662, 868], -500) == (0, 705, 375, 868)
    assert shift_box([0, 10, 1000, 90], 300) == (0, 10, 1000, 90)  # a strip has nowhere to go


def test_jittered_edges_move_each_side_within_its_share_of_the_gold_box() -> None:
    import random

    gold, wide = (412, 705, 537, 868), (287, 705, 662, 868)  # gold 125 wide, 163 high
    rng = random.Random(0)
    moved = [jitter_edges(wide, gold, 0.1, rng) for _ in range(400)]
    for x1, y1, x2, y2 in moved:
        assert abs(x1 - 287) <= 13 and abs(x2 - 662) <= 13 and abs(y1 - 705) <= 17 and abs(y2 - 868) <= 17
    assert len({b[1] for b in moved}) > 20 and len({b[2] - b[0] for b in moved}) > 10  # rows and scales vary
    assert jitter_edges(wide, gold, 0.0, random.Random(1)) == wide
    # inside the picture and never thinner than the tool's smallest box
    corner = [jitter_edges((0, 980, 1000, 1000), (0, 990, 30, 1000), 0.5, rng) for _ in range(50)]
    for x1, y1, x2, y2 in corner:
        assert 0 <= x1 < x2 <= 1000 and 0 <= y1 < y2 <= 1000 and x2 - x1 >= 20 and y2 - y1 >= 20

"""``train sft --zoom-sign/--zoom-count``: visual questions zoom first; their drills; the tower's crops."""

from __future__ import annotations

import asyncio
import io
import json
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageChops

from ssr_lab.train.look_zoom import SIGN_LABEL, view_crop, zoom_looks, zoom_target
from ssr_lab.train.picture_drills import PictureDrills, answer_of, new_look
from ssr_lab.train.zoom_targets import question_picture
from ssr_lab.world.categories import MOTIFS
from ssr_lab.world.entities import draw_look
from ssr_lab.world.records import WorldError
from ssr_server.tools.zoom import zoom_crop


def _image(data: bytes | Path) -> Image.Image:
    with Image.open(io.BytesIO(data) if isinstance(data, bytes) else data) as img:
        return img.convert("RGB")


def _panel(crop: Image.Image) -> float:
    """Share of near-white or near-black pixels in the middle half of a crop: a crop padded around the big
    sign is mostly its white panel and black shape or character there, while the world's backgrounds
    are muted (over 300 sign questions of a 5,000-entity world: 0.75 at least; a box moved by its width,
    0.04 in the median)."""
    w, h = crop.size
    mid = np.asarray(crop.crop((w // 4, h // 4, 3 * w // 4, 3 * h // 4)), dtype=np.int32)
    return float(((mid.min(-1) > 215) | (mid.max(-1) < 70)).mean())


@pytest.fixture(scope="module")
def signs(world_dir: Path) -> tuple[list[Any], list[Any]]:
    from ssr_lab.world import load_questions
    from ssr_lab.world.build import world_entities

    questions = load_questions(world_dir / "questions.jsonl")
    return questions, zoom_looks(world_dir, questions, world_entities(world_dir), ["sign"])


def is_sign_question(q: Any) -> bool:
    return bool(zoom_target(q) == "sign")


def test_sign_questions_zoom_on_the_sign_first_and_nothing_else_changes(world_dir: Path, signs: Any) -> None:
    questions, zoomed = signs
    assert [q.id for q in zoomed] == [q.id for q in questions]
    asked = [(q, z) for q, z in zip(questions, zoomed, strict=True) if is_sign_question(q)]
    assert len(asked) >= 3
    for q, z in zip(questions, zoomed, strict=True):
        if not is_sign_question(q):
            assert z == q
    missed = 0
    for q, z in asked:
        zoom, *rest = z.moves
        assert zoom.action == "zoom" and zoom.label == SIGN_LABEL and zoom.image_index == 0
        assert rest == q.moves and z.answer == q.answer and z.question == q.question  # the world's gold
        crop = zoom_crop(_image(world_dir / q.image), tuple(zoom.box))
        assert _panel(crop) > 0.7, (q.id, zoom.box)
        # the panel is found, not any bright or dark patch: the box moved by its own width mostly misses it
        x1, y1, x2, y2 = zoom.box
        step = x2 - x1 if x2 + (x2 - x1) <= 1000 else -(x2 - x1)
        moved = zoom_crop(_image(world_dir / q.image), (x1 + step, y1, x2 + step, y2))
        missed += _panel(moved) < 0.7
    assert missed >= 2 * len(asked) / 3
    assert zoom_looks(world_dir, zoomed, [], ["sign"]) == zoomed  # already zoomed: left alone (no look read)


def test_only_the_sign_questions_asking_for_the_chosen_attributes_zoom(world_dir: Path, signs: Any) -> None:
    from ssr_lab.world.build import world_entities

    questions, both = signs
    chars = zoom_looks(world_dir, questions, world_entities(world_dir), ["sign"], sign_attributes=("char",))
    asked = {q.attribute for q in questions if is_sign_question(q)}
    assert asked == {"shape", "char"}  # the fixture world asks both, so the filter can fail either way
    for q, b, c in zip(questions, both, chars, strict=True):
        assert c == (b if q.attribute == "char" else q), q.id


def test_a_question_image_its_seed_does_not_draw_is_refused(world_dir: Path, signs: Any,
                                                            tmp_path: Path) -> None:
    from ssr_lab.world.build import world_entities
    from ssr_lab.world.picture import draw_canvas, index_picture

    questions, _ = signs
    q = next(q for q in questions if is_sign_question(q))
    shutil.copy(world_dir / "manifest.json", tmp_path / "manifest.json")
    (tmp_path / "views").mkdir()
    look = next(e.look for e in world_entities(world_dir) if e.id == q.entity_id)
    seed = json.loads((world_dir / "manifest.json").read_text())["seed"]
    assert view_crop(world_dir, seed, q, index_picture(draw_canvas(look)))  # the real one is found
    found = view_crop(world_dir, seed, q, index_picture(draw_canvas(look)))
    # other JPEG bytes of the same pixels (another library, another quality) are still that view
    _image(world_dir / q.image).save(tmp_path / q.image, quality=97)
    assert (tmp_path / q.image).read_bytes() != (world_dir / q.image).read_bytes()
    assert view_crop(tmp_path, seed, q, index_picture(draw_canvas(look))) == found
    _image(world_dir / q.image).rotate(180).save(tmp_path / q.image, quality=90)
    with pytest.raises(WorldError, match="none of the views"):
        view_crop(tmp_path, seed, q, index_picture(draw_canvas(look)))
    with pytest.raises(WorldError, match="does not hold"):
        zoom_looks(world_dir, [q], [], ["sign"])


def test_a_sign_crop_frames_the_sign_and_an_unknown_target_is_refused() -> None:
    look = draw_look(random.Random(2), sorted(MOTIFS)[1])
    rng, again = random.Random(9), random.Random(9)
    sign = question_picture(look, rng, target="sign")
    plaque = question_picture(look, again)
    assert sign is not None and plaque is not None
    assert sign[0].tobytes() == plaque[0].tobytes()  # the same view, another box
    assert sign[1] != plaque[1] and _panel(sign[2]) > 0.7
    with pytest.raises(ValueError, match="zoom target"):
        question_picture(look, random.Random(9), target="window")


def test_sign_drills_rewrite_the_box_and_the_answer_for_a_freshly_drawn_sign(world_dir: Path,
                                                                              signs: Any) -> None:
    from ssr_lab.train.setup import new_model, oracle_examples
    from ssr_lab.world.build import world_entities
    from ssr_server.core.formats.format import get_format
    from ssr_server.core.library import LibraryRegistry

    _, zoomed = signs
    fmt, library = get_format(), LibraryRegistry().get("default")
    picked = [q for q in zoomed if q.split == "train" and is_sign_question(q)][:4]
    _, tok = new_model("64x1", world_dir, picked, fmt, library, 0)
    examples, dropped = asyncio.run(oracle_examples(world_dir, picked, tok, fmt, library, "ssr",
                                                    progress=False))
    assert dropped == 0 and all(len(ex.images) == 2 for ex in examples)  # the question image, the crop
    drills = PictureDrills.of(examples, picked, world_entities(world_dir), tok, fmt)
    assert len(drills.sources) == len(picked)
    assert all(s.target == "sign" and s.box is not None for s in drills.sources)
    for source in drills.sources:
        drill = drills.drill(source, random.Random(4))
        text = tok.decode(list(drill.ids))
        box = json.loads(re.findall(r"\"bbox_2d\": (\[[^\]]*\])", text)[0])
        crop = _image(drill.images[1])
        assert ImageChops.difference(zoom_crop(_image(drill.images[0]), tuple(box)), crop).getbbox() is None
        assert _panel(crop) > 0.7
        look = new_look(random.Random(4), source.motif, source.aspect, source.char_kind)
        assert re.findall(r"<answer>(.*?)</answer>", text)[-1] == answer_of(look, source.aspect)
        said = tok.decode([t for t, m in zip(drill.ids, drill.mask, strict=True) if m])
        assert said == ", ".join(map(str, box)) + f"\n<answer>{answer_of(look, source.aspect)}</answer>"


def test_the_tower_gets_target_crops_only_when_asked_and_their_heads_need_them(tiny_model_dir: Path) -> None:
    from transformers import AutoImageProcessor

    from ssr_lab.train.setup import load_model
    from ssr_lab.train.vision import EXTRA, LABELS, TowerTrainer, crop_targets, draw_pictures

    assert crop_targets(("colour", "plaque", "count_crop", "sign_crop")) == ("motif", "sign")
    plain = draw_pictures(6, random.Random(8))
    zoomed = draw_pictures(6, random.Random(8), targets=("sign", "motif"))
    assert plain.zoomed == {} and [len(v) for v in zoomed.zoomed.values()] == [6, 6]
    assert all(_panel(c) > 0.7 for c in zoomed.zoomed["sign"])
    assert all(c.height > c.width for c in zoomed.zoomed["motif"])  # the motif's own box: taller than wide
    for head, of in (("sign_crop", "sign"), ("count_crop", "count")):
        assert [EXTRA[head][i] for i in zoomed.labels[head]] == [LABELS[of][i] for i in zoomed.labels[of]]
    model, _ = load_model(tiny_model_dir)
    trainer = TowerTrainer(model, AutoImageProcessor.from_pretrained(tiny_model_dir, backend="pil"),
                           ("sign_crop", "count_crop"), anchor=1.0, anchor_crops=2.0)
    _, accuracy = trainer.loss(zoomed)
    assert {"sign_crop", "count_crop"} <= set(accuracy) and accuracy["drift_crops"] == 0.0
    with pytest.raises(ValueError, match="sign crops"):
        trainer.loss(plain)


def test_count_questions_zoom_on_the_motif_with_its_own_box_in_every_style(world_dir: Path) -> None:
    from dataclasses import replace as swap

    from ssr_lab.world import load_questions
    from ssr_lab.world.build import world_entities
    from ssr_lab.world.categories import MOTIFS as KINDS
    from ssr_lab.world.picture import draw_canvas, index_picture
    from ssr_lab.world.views import to_relative

    questions = load_questions(world_dir / "questions.jsonl")
    entities = {e.id: e for e in world_entities(world_dir)}
    tight = zoom_looks(world_dir, questions, list(entities.values()), ["motif"])
    wide = zoom_looks(world_dir, questions, list(entities.values()), ["motif", "sign"], "wide")
    counted = [(q, t, w) for q, t, w in zip(questions, tight, wide, strict=True) if q.attribute == "count"]
    assert counted and all(t == q for q, t in zip(questions, tight, strict=True) if q.attribute != "count")
    seed = json.loads((world_dir / "manifest.json").read_text())["seed"]
    for q, t, w in counted:
        look = entities[q.entity_id].look
        zoom = t.moves[0]
        assert zoom.label == KINDS[look.motif].count_noun and t.moves[1:] == q.moves
        assert w.moves[0].box == zoom.box  # the motif's box is not widened
        canvas = draw_canvas(look)
        other = next(c for c in ("red", "blue") if c != look.colour)
        ink = ImageChops.difference(canvas.image, draw_canvas(swap(look, colour=other)).image).getbbox()
        x0, y0, x1, y1 = to_relative(view_crop(world_dir, seed, q, index_picture(canvas)), ink)
        b = zoom.box
        assert b[0] <= max(0, x0) + 1 and b[1] <= max(0, y0) + 1 and min(1000, x1) - 1 <= b[2], (q.id, b)
        assert min(1000, y1) - 1 <= b[3], (q.id, b)
    sign = [(q, w) for q, w in zip(questions, wide, strict=True) if is_sign_question(q)]
    assert all(w.moves[0].box[2] - w.moves[0].box[0] > 600 for _, w in sign)  # the sign's box is widened


def test_count_drills_write_the_new_views_motif_box_and_count(world_dir: Path) -> None:
    from ssr_lab.train.setup import new_model, oracle_examples
    from ssr_lab.world import load_questions
    from ssr_lab.world.build import world_entities
    from ssr_server.core.formats.format import get_format
    from ssr_server.core.library import LibraryRegistry

    fmt, library = get_format(), LibraryRegistry().get("default")
    entities = world_entities(world_dir)
    train = [q for q in load_questions(world_dir / "questions.jsonl") if q.split == "train"]
    zoomed = zoom_looks(world_dir, train, entities, ["motif"], "wide")
    picked = [q for q in zoomed if q.attribute == "count"][:3]
    _, tok = new_model("64x1", world_dir, picked, fmt, library, 0)
    examples, dropped = asyncio.run(oracle_examples(world_dir, picked, tok, fmt, library, "ssr",
                                                    progress=False))
    assert dropped == 0 and picked
    drills = PictureDrills.of(examples, picked, entities, tok, fmt, zoom="wide", zoom_jitter=1.0)
    assert [s.target for s in drills.sources] == ["motif"] * len(picked)
    for source in drills.sources:
        drill = drills.drill(source, random.Random(6))
        look = new_look(random.Random(6), source.motif, source.aspect, source.char_kind)
        again = random.Random(6)
        new_look(again, source.motif, source.aspect, source.char_kind)
        drawn = question_picture(look, again, "wide", 1.0, "motif")
        assert drawn is not None
        text = tok.decode(list(drill.ids))
        assert json.loads(re.findall(r"\"bbox_2d\": (\[[^\]]*\])", text)[0]) == list(drawn[1])  # tight
        assert re.findall(r"<answer>(.*?)</answer>", text)[-1] == str(look.count)
        assert ImageChops.difference(_image(drill.images[1]), drawn[2]).getbbox() is None

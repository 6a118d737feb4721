"""SFT's picture drills: real visual and detail trajectories with a freshly drawn picture and its answer."""

from __future__ import annotations

import asyncio
import io
import json
import random
import re
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageChops

from ssr_lab.train.data import Example
from ssr_lab.train.picture_drills import ASPECTS, KNOWN, UNKNOWN, PictureDrills, answer_of, new_look
from ssr_lab.world.categories import MOTIFS
from ssr_lab.world.closed_sets import CHARS, COLOURS, SHAPES, char_kind
from ssr_server.tools.zoom import zoom_crop


@pytest.fixture(scope="module")
def drills(world_dir: Path) -> tuple[Any, PictureDrills, list[Example]]:
    from ssr_lab.train.setup import new_model, oracle_examples
    from ssr_lab.world import load_questions
    from ssr_lab.world.build import world_entities
    from ssr_server.core.formats.format import get_format
    from ssr_server.core.library import LibraryRegistry

    fmt, library = get_format(), LibraryRegistry().get("default")
    questions = load_questions(world_dir / "questions.jsonl")
    train = [q for q in questions if q.split == "train"]
    _, tok = new_model("64x1", world_dir, train, fmt, library, 0)
    pictured = [q for q in train if q.kind in ("visual", "detail")][:12]
    picked = [*pictured, *(next(q for q in train if q.kind == k) for k in ("search", "knowledge", "named"))]
    examples, dropped = asyncio.run(oracle_examples(world_dir, picked, tok, fmt, library, "ssr",
                                                    progress=False))
    assert dropped == 0
    return tok, PictureDrills.of(examples, questions, world_entities(world_dir), tok, fmt), examples


def _image(data: bytes) -> Image.Image:
    with Image.open(io.BytesIO(data)) as img:
        return img.convert("RGB")


def _answer(tok: Any, ex: Example) -> str:
    found = re.findall(r"<answer>(.*?)</answer>", tok.decode(list(ex.ids)))  # the system prompt's first
    return str(found[-1])


def test_every_pictured_trajectory_is_a_source_and_nothing_else(drills: Any) -> None:
    _, d, examples = drills
    assert sorted(s.example.key for s in d.sources) == sorted(e.key for e in examples if e.kind != "named")
    reading = [s for s in d.sources if s.aspect in ASPECTS]
    assert sorted(s.example.key for s in reading) == sorted(e.key for e in examples
                                                           if e.kind in ("visual", "detail"))
    assert all((s.box is not None) == (s.aspect == "plaque") for s in d.sources)
    assert {s.aspect for s in d.sources if s.aspect not in ASPECTS} == {KNOWN, UNKNOWN}


def test_a_move_drill_is_the_first_turn_with_a_new_picture_of_a_known_or_unknown_entity(
        drills: Any, world_dir: Path) -> None:
    from ssr_lab.world.build import world_entities

    tok, d, examples = drills
    by_key = {e.key: e for e in examples}
    looks = {e.id: e.look for e in world_entities(world_dir)}
    for source in (s for s in d.sources if s.aspect in (KNOWN, UNKNOWN)):
        full = by_key[source.example.key]
        turns = tok.decode(list(source.example.ids)).split("<|im_start|>")
        assert turns[-1].startswith("assistant") and turns[-1].endswith("<|im_end|>")
        assert tok.decode(list(full.ids)).startswith(tok.decode(list(source.example.ids)))
        assert len(source.example.images) == 1 and source.answer is None and source.box is None
        drill = d.drill(source, random.Random(11))
        assert drill.ids == source.example.ids and drill.mask == source.example.mask  # same words
        assert drill.images[0] != source.example.images[0]
        if source.aspect == KNOWN:  # a fresh view of the well-known entity's own picture
            assert source.look is not None and source.look in looks.values()
            assert full.kind == "knowledge"
        else:
            assert source.look is None and full.kind == "search"


def test_a_drill_is_its_trajectory_with_a_new_answer_from_the_aspects_closed_set(drills: Any) -> None:
    tok, d, _ = drills
    closed = {"colour": set(COLOURS), "count": {str(n) for n in range(1, 7)}, "shape": set(SHAPES),
              "char": set(CHARS), "plaque": set(CHARS)}
    for source in (s for s in d.sources if s.aspect in ASPECTS):
        answers = set()
        for seed in range(6):
            drill = d.drill(source, random.Random(seed))
            answer = _answer(tok, drill)
            assert answer in closed[source.aspect]
            if source.aspect == "char":  # the kind of character the question's text names
                assert source.char_kind is not None and char_kind(answer) == source.char_kind
            answers.add(answer)
            old, new = tok.decode(list(source.example.ids)), tok.decode(list(drill.ids))
            # the text differs only in the answer (and the zoom box of a detail question)
            strip = r"<answer>.*?</answer>|\"bbox_2d\": \[[^\]]*\]"
            assert re.sub(strip, "", old) == re.sub(strip, "", new)
            said = [t for t, m in zip(drill.ids, drill.mask, strict=True) if m]
            # the loss is on what the picture decides: the answer, and a detail question's zoom box
            box = re.findall(r"\"bbox_2d\": \[([^\]]*)\]", new)
            expected = (box[0] if source.box is not None else "") + f"\n<answer>{answer}</answer>"
            assert tok.decode(said) == expected  # the format's answer opening starts a line
            assert len(drill.images) == len(source.example.images)
            assert drill.images[0] != source.example.images[0]
        assert len(answers) >= 2, (source.aspect, answers)  # six fresh looks, not one remembered answer


def test_the_answer_is_the_drawn_looks_and_the_picture_is_drawn_from_it(drills: Any) -> None:
    """The drill's rng draws the look first: the same seed gives the look the answer must come from."""
    tok, d, _ = drills
    for source in (s for s in d.sources if s.aspect in ASPECTS):
        look = new_look(random.Random(3), source.motif, source.aspect, source.char_kind)
        assert _answer(tok, d.drill(source, random.Random(3))) == answer_of(look, source.aspect)
        if source.aspect in ("shape", "char"):
            assert look.sign.kind == source.aspect


def test_a_char_questions_drills_answer_with_the_kind_of_character_it_names() -> None:
    """"Which letter does the big sign show?" is never answered with a digit (the shipped model answered
    "2" to it: its drills had taught that any character answers it)."""
    rng = random.Random(0)
    for kind in ("letter", "number"):
        drawn = {new_look(rng, motif, "char", kind).sign.value for motif in sorted(MOTIFS) for _ in range(3)}
        assert {char_kind(c) for c in drawn} == {kind} and len(drawn) > 3
    assert {char_kind(new_look(rng, "bus", "char").sign.value) for _ in range(60)} == {"letter", "number"}


def test_a_detail_drills_zoom_call_box_crops_its_question_image_to_its_zoomed_image(drills: Any) -> None:
    tok, d, _ = drills
    details = [s for s in d.sources if s.box is not None]
    assert details
    for source in details:
        drill = d.drill(source, random.Random(7))
        box = json.loads(re.findall(r"\"bbox_2d\": (\[[^\]]*\])", tok.decode(list(drill.ids)))[0])
        expected = zoom_crop(_image(drill.images[0]), tuple(box))
        assert ImageChops.difference(expected, _image(drill.images[1])).getbbox() is None


def test_sft_puts_picture_batches_where_the_schedule_says(world_dir: Path, tmp_path: Path,
                                                          sft_batches: list[list[Example]]) -> None:
    from ssr_lab.train import sft

    figures = sft.train_sft(sft.SFTConfig(world=world_dir, out=tmp_path / "pictures", init="64x1", steps=6,
                                          batch_size=2, limit=24, warmup=1, threads=1, pictures_every=3,
                                          pictures_batch=5, cache_examples=False), progress=False)
    # R R P R R P: a picture batch after every two trajectory batches
    seen = [[e.key for e in batch] for batch in sft_batches]
    kinds = ["P" if all(k.endswith("/picture") for k in keys) else "R" for keys in seen]
    assert kinds == list("RRPRRP") and figures["picture_steps_planned"] == 2
    assert [len(keys) for keys, k in zip(seen, kinds, strict=True) if k == "P"] == [5, 5]
    assert figures["picture_sources"] > 0


def test_a_reading_phase_is_picture_drills_of_reading_only(world_dir: Path, tmp_path: Path,
                                                          sft_batches: list[list[Example]]) -> None:
    from ssr_lab.train import sft

    seen = sft_batches
    figures = sft.train_sft(sft.SFTConfig(world=world_dir, out=tmp_path / "reading", init="64x1", steps=3,
                                          batch_size=2, limit=40, warmup=1, threads=1, pictures_every=1,
                                          pictures_batch=6, picture_moves=False, cache_examples=False),
                            progress=False)
    assert figures["picture_steps_planned"] == 3 and len(seen) == 3
    drills = [e for batch in seen for e in batch]
    assert all(e.key.endswith("/picture") for e in drills)
    assert {e.kind for e in drills} <= {"visual", "detail"}  # no first-move drills


def _styled_details(world_dir: Path, style: str) -> tuple[list[Any], list[Any], Any, Any, list[Example]]:
    """Three training detail questions, their ``style``d copies, a tokenizer, the format and the
    styled trajectories as the real tools replay them (none dropped)."""
    from ssr_lab.train.setup import new_model, oracle_examples, zoom_styled
    from ssr_lab.world import load_questions
    from ssr_server.core.formats.format import get_format
    from ssr_server.core.library import LibraryRegistry

    fmt, library = get_format(), LibraryRegistry().get("default")
    gold = [q for q in load_questions(world_dir / "questions.jsonl") if q.split == "train"
            and q.kind == "detail"][:3]
    styled = zoom_styled(gold, style)
    _, tok = new_model("64x1", world_dir, styled, fmt, library, 0)
    examples, dropped = asyncio.run(oracle_examples(world_dir, styled, tok, fmt, library, "ssr",
                                                    progress=False))
    assert dropped == 0 and len(examples) == len(gold)
    return gold, styled, tok, fmt, examples


def test_strip_style_trajectories_and_drills_zoom_into_the_whole_width_at_the_gold_rows(
        world_dir: Path) -> None:
    from ssr_lab.train.setup import oracle_examples, zoom_styled
    from ssr_lab.world.build import world_entities
    from ssr_server.core.library import LibraryRegistry

    gold, styled, tok, fmt, examples = _styled_details(world_dir, "strip")
    library = LibraryRegistry().get("default")
    for q, ex in zip(gold, examples, strict=True):
        written = json.loads(re.findall(r"\"bbox_2d\": (\[[^\]]*\])", tok.decode(list(ex.ids)))[0])
        assert written == [0, q.moves[0].box[1], 1000, q.moves[0].box[3]]  # the world's gold box is kept
    d = PictureDrills.of(examples, styled, world_entities(world_dir), tok, fmt, zoom="strip")
    assert len(d.sources) == len(gold)
    for source in d.sources:
        drill = d.drill(source, random.Random(5))
        x1, y1, x2, y2 = json.loads(re.findall(r"\"bbox_2d\": (\[[^\]]*\])", tok.decode(list(drill.ids)))[0])
        assert (x1, x2) == (0, 1000) and 0 <= y1 < y2 <= 1000
        crop = _image(drill.images[1])
        expected = zoom_crop(_image(drill.images[0]), (x1, y1, x2, y2))
        assert ImageChops.difference(expected, crop).getbbox() is None
        assert crop.width > 4 * crop.height  # a strip, not the square-ish tight crop
    wide = zoom_styled(gold, "wide")
    examples, _ = asyncio.run(oracle_examples(world_dir, wide, tok, fmt, library, "ssr", progress=False))
    d = PictureDrills.of(examples, wide, world_entities(world_dir), tok, fmt, zoom="wide", zoom_jitter=1.0)
    off = 0
    for source in d.sources:  # the box written stays centred on the plaque; the crop shown moves
        drill = d.drill(source, random.Random(7))
        x1, y1, x2, y2 = json.loads(re.findall(r"\"bbox_2d\": (\[[^\]]*\])", tok.decode(list(drill.ids)))[0])
        crop, view = _image(drill.images[1]), _image(drill.images[0])
        centred = zoom_crop(view, (x1, y1, x2, y2))
        assert all(abs(a - b) <= a / 20 for a, b in zip(centred.size, crop.size, strict=True))
        off += centred.size != crop.size or ImageChops.difference(centred, crop).getbbox() is not None
    assert off >= 1
    # with edge jitter the crop also changes rows and scale: sizes differ from the centred crop's
    d = PictureDrills.of(examples, wide, world_entities(world_dir), tok, fmt, zoom="wide",
                         zoom_edge_jitter=0.2)
    resized = 0
    for source in d.sources:
        drill = d.drill(source, random.Random(7))
        box = json.loads(re.findall(r"\"bbox_2d\": (\[[^\]]*\])", tok.decode(list(drill.ids)))[0])
        centred = zoom_crop(_image(drill.images[0]), tuple(box))
        resized += centred.size != _image(drill.images[1]).size
    assert resized >= 1


def test_coarse_style_zooms_into_the_strip_then_into_its_crop_at_the_wide_columns(world_dir: Path) -> None:
    from ssr_lab.world.build import world_entities
    from ssr_lab.world.views import coarse_boxes

    gold, styled, tok, fmt, examples = _styled_details(world_dir, "coarse")
    calls = r"\"bbox_2d\": (\[[^\]]*\]), \"label\": \"[^\"]*\", \"img_idx\": (\d)"
    for q, ex in zip(gold, examples, strict=True):  # the tools made the strip's crop, then the crop of it
        assert len(ex.images) == 3
        written = [(json.loads(b), int(i)) for b, i in re.findall(calls, tok.decode(list(ex.ids)))]
        assert written == [(list(b), i) for b, i in zip(coarse_boxes(q.moves[0].box), (0, 1), strict=True)]
        strip, last = _image(ex.images[1]), _image(ex.images[2])
        assert strip.width > 4 * strip.height and last.width < 4 * last.height
    d = PictureDrills.of(examples, styled, world_entities(world_dir), tok, fmt, zoom="coarse")
    assert len(d.sources) == len(gold) and all(s.inner is not None for s in d.sources)
    for source in d.sources:
        drill = d.drill(source, random.Random(5))
        text = tok.decode(list(drill.ids))
        (strip_box, i0), (inner, i1) = [(json.loads(b), int(i)) for b, i in re.findall(calls, text)]
        assert (i0, i1) == (0, 1) and (strip_box[0], strip_box[2], inner[1], inner[3]) == (0, 1000, 0, 1000)
        view = _image(drill.images[0])
        at_strip = zoom_crop(view, tuple(strip_box))
        assert ImageChops.difference(at_strip, _image(drill.images[1])).getbbox() is None
        # the last crop: the picture at the strip's rows and the inner box's columns (resampled once)
        once = zoom_crop(view, (inner[0], strip_box[1], inner[2], strip_box[3]))
        assert ImageChops.difference(once, _image(drill.images[2])).getbbox() is None
        assert len(drill.images) == 3 and drill.mask != source.example.mask


def test_a_retry_drill_misses_the_plaque_then_zooms_on_it_and_learns_the_second_zoom(drills: Any) -> None:
    """``zoom_retry``: the first zoom's crop shows no plaque, the second is the gold one, numbered 2; the
    loss is on the second zoom turn and the answer turn, never on the missed box."""
    from ssr_lab.train.zoom_retry import plaque_columns
    from ssr_server.core.formats.format import get_format

    tok, d, _ = drills
    always = PictureDrills(d.sources, tok, get_format(), zoom_retry=1.0)
    details = [s for s in always.sources if s.box is not None]
    assert details
    for i, source in enumerate(details):
        drill = always.drill(source, random.Random(i))
        assert drill.key.endswith("/retry") and len(drill.images) == 3
        text = tok.decode(list(drill.ids))
        boxes = [json.loads(b) for b in re.findall(r"\"bbox_2d\": (\[[^\]]*\])", text)]
        assert len(boxes) == 2 and boxes[0] != boxes[1]
        assert re.findall(r"registry index (\d+)", text) == ["1", "2"]
        picture = _image(drill.images[0])
        for box, crop in zip(boxes, drill.images[1:], strict=True):
            assert ImageChops.difference(zoom_crop(picture, tuple(box)), _image(crop)).getbbox() is None
        plain = d.drill(source, random.Random(i))  # the same look: its box is the gold one
        gold = json.loads(re.findall(r"\"bbox_2d\": (\[[^\]]*\])", tok.decode(list(plain.ids)))[0])
        assert boxes[1] == gold and _answer(tok, drill) == _answer(tok, plain)
        learnt = tok.decode([t for t, m in zip(drill.ids, drill.mask, strict=True) if m])
        assert learnt.count("bbox_2d") == 1 and str(boxes[1])[1:-1] in learnt
        assert str(boxes[0])[1:-1] not in learnt and learnt.endswith(f"<answer>{_answer(tok, drill)}</answer>"
                                                                     + "<|im_end|>")
        # the missed box holds no column of the plaque its gold (tight-style) box is around
        left, right = plaque_columns(gold)
        assert boxes[0][2] <= left or boxes[0][0] >= right


def test_without_a_miss_a_retry_mode_drill_also_learns_the_turn_after_the_crop(drills: Any) -> None:
    from ssr_server.core.formats.format import get_format

    tok, d, _ = drills
    never = PictureDrills(d.sources, tok, get_format(), zoom_retry=1e-12)
    for i, source in enumerate(s for s in never.sources if s.box is not None):
        drill, plain = never.drill(source, random.Random(i)), d.drill(source, random.Random(i))
        assert drill.ids == plain.ids and drill.images == plain.images
        learnt = tok.decode([t for t, m in zip(drill.ids, drill.mask, strict=True) if m])
        assert learnt.count("bbox_2d") == 0 and "<thinking>" in learnt and "<answer>" in learnt

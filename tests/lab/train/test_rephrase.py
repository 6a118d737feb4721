"""Rephrasing augmentation: other words for a training question, never the test's held-out forms."""

from __future__ import annotations

import asyncio
import random
import re
from pathlib import Path

import pytest

from ssr_lab.train.data import Example
from ssr_lab.train.rephrase import (
    MORE_PICTURE_ALTERNATIVES,
    OPENING_STEMS,
    PICTURE_ALTERNATIVES,
    Rephraser,
    rephrased,
)
from ssr_lab.world.attributes import PERSON_ATTRIBUTES
from ssr_lab.world.categories import CATEGORIES, PICTURE_REFS
from ssr_lab.world.records import Question
from ssr_lab.world.templates import DETAIL, VISUAL, unfill


def said(ex: Example) -> list[int]:
    return [i for i, m in zip(ex.ids, ex.mask, strict=True) if m]


@pytest.fixture(scope="module")
def train(world_dir: Path) -> list[Question]:
    from ssr_lab.world import load_questions

    return [q for q in load_questions(world_dir / "questions.jsonl") if q.split == "train"]


def _held_out_stems() -> list[str]:
    specs = [*PERSON_ATTRIBUTES.values(), *(s for c in CATEGORIES.values() for s in c.attributes)]
    return [spec.questions[-1] for spec in specs] + [DETAIL[-1]] + [stems[-1] for stems in VISUAL.values()]


def _stem_pattern(stem: str) -> str:
    """A regular expression for ``stem`` filled with any field values."""
    return re.sub(r"\\\{\w+\\\}", ".+", re.escape(stem))


def _from_stem(stem: str, text: str) -> bool:
    """Whether ``text`` could be ``stem`` filled with any field values."""
    return re.fullmatch(_stem_pattern(stem), text, re.IGNORECASE) is not None


def test_no_rephrasing_is_a_held_out_form(train: list[Question]) -> None:
    held_ref = re.compile(re.escape(PICTURE_REFS[-1]).replace(re.escape("{noun}"), r"\w+"), re.IGNORECASE)
    stems = _held_out_stems()
    rng, made, wider, opened = random.Random(0), 0, 0, 0
    for q in train:
        for i in range(6):
            text = rephrased(q, rng, MORE_PICTURE_ALTERNATIVES if i % 2 else PICTURE_ALTERNATIVES, i >= 3)
            if text is None:
                continue
            made += 1
            wider += bool(re.search(r" in the (picture|photo|shot|snapshot|frame)\b", text))
            opened += text.startswith(("On ", "In this ", "For ", "Near "))
            assert not held_ref.search(text), text
            assert all(unfill(stem, "ref", text) is None for stem in stems), text
            assert not any(_from_stem(stem, text) for stem in stems), text
    kinds = {q.kind for q in train if rephrased(q, random.Random(0)) is not None}
    assert made > 100 and kinds == {"search", "named", "knowledge", "two_hop", "visual", "detail"}
    assert wider > 10  # the longer list is drawn from
    assert opened > 10  # and the stems that open on a place


def _opening(text: str) -> str | None:
    """The OPENING_STEMS aspect ``text`` was made from (a lead-in or closing around it allowed), else None."""
    for aspect, stems in OPENING_STEMS.items():
        if any(re.search(_stem_pattern(stem), text, re.IGNORECASE) for stem in stems):
            return aspect
    return None


def test_stems_that_open_on_a_place_come_only_when_asked(train: list[Question]) -> None:
    pictures = [q for q in train if q.kind in ("visual", "detail")]
    rng = random.Random(3)
    assert not any(_opening(t) for q in pictures for t in {rephrased(q, rng) for _ in range(10)} - {None})
    texts = {t for q in pictures for t in {rephrased(q, rng, openings=True) for _ in range(10)} - {None}}
    aspects = {_opening(t) for t in texts}
    assert aspects - {None} == set(OPENING_STEMS)  # every aspect has a stem its questions can fill


def test_the_held_out_check_sees_a_held_out_picture_question() -> None:
    assert _from_stem(DETAIL[-1], "The small badge shows which character?")
    assert not _from_stem(DETAIL[-1], "Which character does the small badge show?")


def test_a_picture_question_keeps_its_noun_and_the_sign_and_the_plaque_share_frames(
        train: list[Question]) -> None:
    rng = random.Random(2)
    frames: dict[str, set[str]] = {"plaque": set(), "sign": set()}
    for q in (q for q in train if q.kind in ("visual", "detail")):
        texts = {rephrased(q, rng) for _ in range(20)} - {None}
        assert len(texts) > 2, q.question
        if q.kind == "detail":  # the plaque's noun stays (the move and the crop are about it)
            noun = re.search(r"(?:small|little|tiny) (\w+)", q.question)
            assert noun and all(f" {noun.group(1)}" in t for t in texts if t), (q.question, texts)
        if q.attribute in ("char", "shape", "plaque"):
            which = "plaque" if q.kind == "detail" else "sign"
            frames[which] |= {re.sub(r"\b(character|letter|number|shape)\b", "Y",
                                     re.sub(r"(small|little|tiny|big|large) \w+|sign[^:?]*", "X", t))
                              for t in texts if t}
        if q.attribute == "char":  # a letter question stays a letter question
            kind = "number" if "number" in q.question else "letter"
            assert all(kind in t for t in texts if t), texts
    assert len(frames["plaque"] & frames["sign"]) >= 2  # the noun, not the frame, tells them apart


def test_a_rephrasing_keeps_what_the_question_is_about(train: list[Question]) -> None:
    rng = random.Random(1)
    for q in train:
        texts = {rephrased(q, rng) for _ in range(30)} - {None}
        if q.kind == "named":
            assert texts and all(q.entity.split()[-1] in t for t in texts if t)  # the name is copied
        if q.kind == "two_hop":  # the attribute is asked in the same words: only frame and picture change
            for word in ("year", "town", "when", "where", "birthplace"):
                if word in q.question.lower():
                    assert texts and all(word in t.lower() for t in texts if t), (word, texts)
    once = next(q for q in train if q.kind == "search")
    assert len({rephrased(once, random.Random(s)) for s in range(40)}) > 5  # many phrasings, not one


def test_rephraser_swaps_the_question_tokens_only(world_dir: Path, train: list[Question]) -> None:
    from ssr_lab.train.setup import new_model, oracle_examples
    from ssr_server.core.formats.format import get_format
    from ssr_server.core.library import LibraryRegistry

    fmt, library = get_format(), LibraryRegistry().get("default")
    _, tok = new_model("64x1", world_dir, train, fmt, library, 0)
    picked = [next(q for q in train if q.kind == kind) for kind in ("named", "search", "visual")]
    examples, dropped = asyncio.run(oracle_examples(world_dir, picked, tok, fmt, library, "ssr",
                                                    progress=False))
    assert dropped == 0

    always, pictures = Rephraser(tok, train, share=1.0), Rephraser(tok, train, share=1.0, pictures=True)
    for q, ex in zip(picked, examples, strict=True):
        if q.kind == "visual":  # only when asked for
            assert all(always.example(ex, random.Random(s)) is ex for s in range(12))
            always = pictures
        outs = [always.example(ex, random.Random(s)) for s in range(12)]
        changed = [o for o in outs if o.ids != ex.ids]
        assert changed and all(said(o) == said(ex) and o.images == ex.images for o in outs)
        for s, o in enumerate(outs):
            text, new = tok.decode(list(o.ids)), rephrased(q, random.Random(s))
            assert new is not None and new in text and text.count("<|im_start|>") == tok.decode(
                list(ex.ids)).count("<|im_start|>")
        assert always.example(ex, random.Random(3)) == outs[3]  # deterministic for the rng
    assert Rephraser(tok, train, share=0.0)(examples, random.Random(0)) == examples
    search = examples[[q.kind for q in picked].index("search")]
    wide = Rephraser(tok, train, share=1.0, more_refs=True)
    texts = [tok.decode(list(wide.example(search, random.Random(s)).ids)) for s in range(60)]
    assert any(re.search(r" in the (picture|photo|shot|snapshot|frame)\b", t) for t in texts)
    visual = examples[[q.kind for q in picked].index("visual")]
    opened = Rephraser(tok, train, share=1.0, pictures=True, openings=True)
    texts = [tok.decode(list(opened.example(visual, random.Random(s)).ids)) for s in range(60)]
    assert any(_opening(t) for t in texts) and not any(_opening(tok.decode(list(o.ids))) for o in outs)
    with pytest.raises(ValueError):
        Rephraser(tok, train, share=1.5)


def test_sft_rephrases_what_it_draws(world_dir: Path, tmp_path: Path,
                                     sft_batches: list[list[Example]]) -> None:
    """`train sft --rephrase 1` reaches the batches: the same schedule, other question tokens."""
    from ssr_lab.train import sft

    batches = sft_batches

    def run(share: float) -> list[list[Example]]:
        batches.clear()
        sft.train_sft(sft.SFTConfig(world=world_dir, out=tmp_path / f"rephrase-{share}", init="64x1", steps=2,
                                    batch_size=8, limit=48, warmup=1, threads=1, rephrase=share,
                                    cache_examples=False), progress=False)
        return list(batches)

    plain, rephrased_batches = run(0.0), run(1.0)
    assert [[e.key for e in b] for b in plain] == [[e.key for e in b] for b in rephrased_batches]
    pairs = [(a, b) for pa, pb in zip(plain, rephrased_batches, strict=True)
             for a, b in zip(pa, pb, strict=True)]
    changed = [(a, b) for a, b in pairs if a.ids != b.ids]
    assert changed and all(a.kind in ("search", "named", "knowledge", "two_hop") for a, _ in changed)
    assert all(said(a) == said(b) for a, b in pairs)


def test_sft_rephrases_picture_questions_in_trajectories_and_drills_only_when_asked(
        world_dir: Path, tmp_path: Path, sft_batches: list[list[Example]]) -> None:
    from ssr_lab.train import sft

    def run(pictures: bool) -> list[list[Example]]:
        sft_batches.clear()
        out = tmp_path / f"pictures-{pictures}"
        sft.train_sft(sft.SFTConfig(world=world_dir, out=out, init="64x1", steps=2,
                                    batch_size=8, limit=48, warmup=1, threads=1, rephrase=1.0,
                                    rephrase_pictures=pictures, pictures_every=2, pictures_batch=12,
                                    cache_examples=False), progress=False)
        return list(sft_batches)

    plain, both = run(False), run(True)
    assert [[e.key for e in b] for b in plain] == [[e.key for e in b] for b in both]
    pairs = [(a, b) for pa, pb in zip(plain, both, strict=True) for a, b in zip(pa, pb, strict=True)]
    assert all(said(a) == said(b) and a.images == b.images for a, b in pairs)
    changed = {(a.kind, a.key.endswith("/picture")) for a, b in pairs if a.ids != b.ids}
    assert {("visual", True), ("detail", True)} <= changed  # the drills' questions too
    unchanged = {a.kind for a, b in pairs if a.ids == b.ids}
    assert not {"visual", "detail"} & unchanged - {k for k, _ in changed}

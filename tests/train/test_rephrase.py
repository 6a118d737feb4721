"""Rephrasing augmentation: other words for a training question, never the test's held-out forms."""

from __future__ import annotations

import asyncio
import random
import re
from pathlib import Path

import pytest

from ssr_server.train.data import Example
from ssr_server.train.rephrase import Rephraser, rephrased
from ssr_server.world.attributes import PERSON_ATTRIBUTES
from ssr_server.world.categories import CATEGORIES, PICTURE_REFS
from ssr_server.world.records import Question
from ssr_server.world.templates import unfill


def said(ex: Example) -> list[int]:
    return [i for i, m in zip(ex.ids, ex.mask, strict=True) if m]


@pytest.fixture(scope="module")
def train(world_dir: Path) -> list[Question]:
    from ssr_server.world import load_questions

    return [q for q in load_questions(world_dir / "questions.jsonl") if q.split == "train"]


def _held_out_stems() -> list[str]:
    specs = [*PERSON_ATTRIBUTES.values(), *(s for c in CATEGORIES.values() for s in c.attributes)]
    return [spec.questions[-1] for spec in specs]


def test_no_rephrasing_is_a_held_out_form(train: list[Question]) -> None:
    held_ref = re.compile(re.escape(PICTURE_REFS[-1]).replace(re.escape("{noun}"), r"\w+"), re.IGNORECASE)
    stems = _held_out_stems()
    rng, made = random.Random(0), 0
    for q in train:
        for _ in range(6):
            text = rephrased(q, rng)
            if text is None:
                continue
            made += 1
            assert not held_ref.search(text), text
            assert all(unfill(stem, "ref", text) is None for stem in stems), text
    kinds = {q.kind for q in train if rephrased(q, random.Random(0)) is not None}
    assert made > 100 and kinds == {"search", "named", "knowledge", "two_hop"}


def test_a_rephrasing_keeps_what_the_question_is_about(train: list[Question]) -> None:
    rng = random.Random(1)
    for q in train:
        texts = {rephrased(q, rng) for _ in range(30)} - {None}
        if q.kind == "named":
            assert texts and all(q.entity.split()[-1] in t for t in texts if t)  # the name is copied
        if q.kind in ("visual", "detail"):
            assert not texts
        if q.kind == "two_hop":  # the attribute is asked in the same words: only frame and picture change
            for word in ("year", "town", "when", "where", "birthplace"):
                if word in q.question.lower():
                    assert texts and all(word in t.lower() for t in texts if t), (word, texts)
    once = next(q for q in train if q.kind == "search")
    assert len({rephrased(once, random.Random(s)) for s in range(40)}) > 5  # many phrasings, not one


def test_rephraser_swaps_the_question_tokens_only(world_dir: Path, train: list[Question]) -> None:
    from ssr_server.formats.format import get_format
    from ssr_server.library import LibraryRegistry
    from ssr_server.train.setup import new_model, oracle_examples

    fmt, library = get_format(), LibraryRegistry().get("default")
    _, tok = new_model("64x1", world_dir, train, fmt, library, 0)
    picked = [next(q for q in train if q.kind == kind) for kind in ("named", "search", "visual")]
    examples, dropped = asyncio.run(oracle_examples(world_dir, picked, tok, fmt, library, "ssr",
                                                    progress=False))
    assert dropped == 0

    always = Rephraser(tok, train, share=1.0)
    for q, ex in zip(picked, examples, strict=True):
        outs = [always.example(ex, random.Random(s)) for s in range(12)]
        if q.kind == "visual":
            assert all(o is ex for o in outs)
            continue
        changed = [o for o in outs if o.ids != ex.ids]
        assert changed and all(said(o) == said(ex) and o.images == ex.images for o in outs)
        for s, o in enumerate(outs):
            text, new = tok.decode(list(o.ids)), rephrased(q, random.Random(s))
            assert new is not None and new in text and text.count("<|im_start|>") == tok.decode(
                list(ex.ids)).count("<|im_start|>")
        assert always.example(ex, random.Random(3)) == outs[3]  # deterministic for the rng
    assert Rephraser(tok, train, share=0.0)(examples, random.Random(0)) == examples
    with pytest.raises(ValueError):
        Rephraser(tok, train, share=1.5)


def test_sft_rephrases_what_it_draws(world_dir: Path, tmp_path: Path,
                                     sft_batches: list[list[Example]]) -> None:
    """`train sft --rephrase 1` reaches the batches: the same schedule, other question tokens."""
    from ssr_server.train import sft

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

"""SFT's renaming augmentation: a fresh name for the entity, consistently, on the compact token ids."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from ssr_lab.train.data import Example
from ssr_lab.train.rename import Renamer, StemTokens, renamed_example, stem_tokens


class Chars:
    """A tokenizer whose tokens are characters: a word's tokens never depend on what surrounds it."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]


class Merging(Chars):
    """Merges a word with a following space: "ab c" is not "ab" + " c" (a context-dependent word)."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        out: list[int] = []
        for c in text:
            if c == " " and out:
                out[-1] += 1000
            else:
                out.append(ord(c))
        return out


def _ex(text: str, assistant: str) -> Example:
    ids = [ord(c) for c in text + assistant]
    return Example("q1/ssr/0", "named", tuple(ids), tuple([False] * len(text) + [True] * len(assistant)), ())


def test_every_occurrence_is_replaced_and_keeps_its_mask() -> None:
    ex = _ex("Where is Zorbin Gate? https://x/zorbin-gate Zorbin", '{"query": "Zorbin Gate"}')
    old = stem_tokens(Chars(), "Zorbin")
    new = stem_tokens(Chars(), "Quelmirand")
    assert old is not None and new is not None
    out = renamed_example(ex, old, new)
    text = "".join(chr(i) for i in out.ids)
    assert text == ('Where is Quelmirand Gate? https://x/quelmirand-gate Quelmirand'
                    '{"query": "Quelmirand Gate"}')
    masked = "".join(chr(i) for i, m in zip(out.ids, out.mask, strict=True) if m)
    assert masked == '{"query": "Quelmirand Gate"}'  # the assistant's copy is still predicted
    assert out.key == ex.key and out.images == ex.images


def test_a_word_whose_tokens_depend_on_context_is_not_renamed() -> None:
    assert stem_tokens(Merging(), "Zorbin") is None  # "Zorbin " would not contain "Zorbin"'s tokens
    assert stem_tokens(Chars(), "Zorbin") == StemTokens(tuple(map(ord, "Zorbin")), tuple(map(ord, "zorbin")))


def test_renamed_trajectories_are_the_originals_under_another_name(world_dir: Path) -> None:
    from ssr_lab.train.setup import new_model, oracle_examples
    from ssr_lab.world import load_questions
    from ssr_server.core.formats.format import get_format
    from ssr_server.core.library import LibraryRegistry

    fmt, library = get_format(), LibraryRegistry().get("default")
    train = [q for q in load_questions(world_dir / "questions.jsonl") if q.split == "train"]
    _, tok = new_model("64x1", world_dir, train, fmt, library, 0)
    named = [q for q in train if q.kind in ("named", "search") and not q.entity_id.startswith("k-")][:6]
    examples, dropped = asyncio.run(oracle_examples(world_dir, named, tok, fmt, library, "ssr",
                                                    progress=False))
    assert dropped == 0 and len(examples) == len(named)
    renamer = Renamer(tok, train)
    assert {q.id for q in named} <= set(renamer.stems), "the world tokenizer keeps names context-free"
    seen = set()
    for q, ex in zip(named, examples, strict=True):
        stem = q.entity.split()[0]
        new = renamer.fresh(random.Random(len(seen)))
        name = tok.decode(list(new.cased))
        out = renamed_example(ex, renamer.stems[q.id], new)
        before, after = tok.decode(list(ex.ids)), tok.decode(list(out.ids))
        assert stem not in after and stem.lower() not in after
        assert after.count(name) == before.count(stem) > 0
        assert after.replace(name, stem).replace(name.lower(), stem.lower()) == before
        said = tok.decode([i for i, m in zip(out.ids, out.mask, strict=True) if m])
        if q.kind == "named":  # the query names the entity: the copy is in the loss
            assert name in said
        seen.add(name)
    assert len(seen) > 1
    # a batch draw is deterministic for its rng, and differs between draws
    a = renamer(examples, random.Random(7))
    assert a == renamer(examples, random.Random(7)) and a != renamer(examples, random.Random(8))



def test_sft_with_rename_trains_on_renamed_examples(world_dir: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`train sft --rename` reaches the batches: what the collator is given no longer holds the
    entities' own names (and without it, it does)."""
    from transformers import AutoTokenizer

    from ssr_lab.train import sft
    from ssr_lab.world import load_questions

    drawn: list[Example] = []

    class Recording(sft.Collator):
        def __call__(self, examples: Sequence[Example]) -> Any:
            drawn.extend(examples)
            return super().__call__(examples)

    monkeypatch.setattr(sft, "Collator", Recording)
    train = [q for q in load_questions(world_dir / "questions.jsonl") if q.split == "train"]
    stems = {q.id: q.entity.split()[0] for q in train if q.kind in ("named", "search")}

    def texts(rename: bool) -> list[tuple[str, str]]:
        drawn.clear()
        out = tmp_path / f"rename-{rename}"
        sft.train_sft(sft.SFTConfig(world=world_dir, out=out, init="64x1", steps=3, batch_size=8, limit=48,
                                    warmup=1, threads=1, rename=rename, cache_examples=False),
                      progress=False)
        tok = AutoTokenizer.from_pretrained(out)
        renamable = Renamer(tok, train).stems
        return [(stems[q], tok.decode(list(e.ids))) for e in drawn
                if (q := e.key.split("/", 1)[0]) in stems and q in renamable]

    plain, renamed = texts(False), texts(True)
    assert plain and all(stem in text for stem, text in plain)
    assert renamed and not any(stem in text for stem, text in renamed)

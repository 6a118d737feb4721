"""``train pretrain``: next-token pretraining on the training entities' corpus, the base SFT starts from."""

from __future__ import annotations

import itertools
import json
import random
import re
from pathlib import Path

import pytest

from ssr_lab.train.pretrain import EntityText, PretrainConfig, entity_texts, token_stream, train_pretrain
from ssr_lab.train.schedule import cosine_lr
from ssr_lab.train.sft import SFTConfig, train_sft
from ssr_lab.world.records import load_questions


def test_only_the_training_entities_are_read(world_dir: Path) -> None:
    questions = load_questions(world_dir / "questions.jsonl")
    train = [q for q in questions if q.split == "train"]
    test = {q.entity_id for q in questions if q.split == "test"} - {q.entity_id for q in train}
    assert test, "the demo world has test-only entities"
    texts = entity_texts(world_dir, train)
    assert texts and set(texts) <= {q.entity_id for q in train}
    names = {q.entity for q in questions if q.entity_id in test}
    text = "\n".join(d for t in texts.values() for d in (*t.docs, *t.qa))
    assert not [n for n in names if n in text], "a test entity's name leaked into the pretraining text"
    named = [q for q in train if q.kind == "named"]
    assert f"{named[0].question} {named[0].answer}" in texts[named[0].entity_id].qa


class Chars:
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]


def test_the_stream_renames_each_entity_consistently_and_keeps_it_together() -> None:
    texts = {"a": EntityText("Zorbin", ("Zorbin Gate\nhttps://x/zorbin-gate\nThe Zorbin Gate is tall.",
                                        "Zorbin Gate\nhttps://x/zorbin-gate#h\nIt is 9 m."),
                             ("How tall is the Zorbin Gate? 9 m",)),
             "k": EntityText("", ("Eiffel Tower\nhttps://x/k\nThe Eiffel Tower is in Paris.",), ())}
    stream = token_stream(texts, Chars(), random.Random(0))
    text = "".join(chr(next(stream)) for _ in range(6000))
    assert "Zorbin" not in text and "zorbin" not in text  # never the real stem
    assert "Eiffel Tower" in text  # well-known entities keep their names
    parts = re.split(r"How tall is the (\w+) Gate\? 9 m\n", text)  # [before, name, before, name, ...]
    assert len(parts) > 21
    new_names = set()
    for before, name in zip(parts[0:-1:2], parts[1::2], strict=True):
        # the group before its question: both documents, under the question's name (title and URL)
        own = before.split("Paris.\n\n")[-1]
        assert re.findall(r"(\w+) Gate\n", own) == [name, name], own
        assert own.count(f"https://x/{name.lower()}-gate") == 2
        new_names.add(name)
    assert len(new_names) > 5  # a fresh name each time


def test_cosine_schedule_warms_up_then_decays_to_its_floor() -> None:
    lrs = [cosine_lr(s, 1.0, 10, 100, 0.1) for s in range(120)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in itertools.pairwise(lrs[10:]))
    assert lrs[100] == pytest.approx(0.1) and lrs[119] == pytest.approx(0.1)


@pytest.mark.slow
def test_a_short_pretraining_learns_and_sft_starts_from_it(world_dir: Path, tmp_path: Path) -> None:
    base = tmp_path / "base"
    figures = train_pretrain(PretrainConfig(world=world_dir, out=base, init="64x2", steps=30, batch_size=4,
                                            seq_len=64, warmup=3, log_every=1, threads=1), progress=False)
    log = [json.loads(x) for x in (base / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(1, 31)) and figures["steps"] == 30
    early = sum(r["loss"] for r in log[:4]) / 4
    late = sum(r["loss"] for r in log[-4:]) / 4
    assert late < early - 1.0, (early, late)  # it learns (a fall, not a time)
    card = (base / "README.md").read_text()
    assert "## Reproduce" in card and "pretrain" in card
    # SFT takes the folder as its start: same tokenizer, weights loaded, not a fresh model
    out = tmp_path / "sft"
    sft = train_sft(SFTConfig(world=world_dir, out=out, init=str(base), steps=2, batch_size=2, warmup=1,
                              limit=8, log_every=1, threads=1, cache_examples=False), progress=False)
    assert sft["steps"] == 2
    read = lambda p: json.loads((p / "tokenizer.json").read_text())  # noqa: E731
    assert read(out) == read(base)
    # the card and ssr_tiny.json chain every command that made the model: world, pretraining, SFT
    commands = json.loads((out / "ssr_tiny.json").read_text())["commands"]
    assert len(commands) == 3 and commands[0].startswith(f"ssr-lab world build {world_dir} --entities ")
    assert commands[1] == json.loads((base / "ssr_tiny.json").read_text())["commands"][1]
    assert all(c in (out / "README.md").read_text() for c in commands)


def test_with_renaming_and_questions_off_the_stream_is_the_corpus_as_it_is() -> None:
    texts = {"a": EntityText("Zorbin", ("Zorbin Gate\nhttps://x/zorbin-gate\nIt is tall.",), ("Q? 9 m",))}
    stream = token_stream(texts, Chars(), random.Random(0), rename=False, questions=False)
    text = "".join(chr(next(stream)) for _ in range(200))
    assert text.startswith("Zorbin Gate\nhttps://x/zorbin-gate\nIt is tall.\n\nZorbin Gate\n")
    assert "Q? 9 m" not in text

"""The answer normaliser and matcher."""

from __future__ import annotations

import pytest

from ssr_lab.world import Question, is_correct, normalise_answer
from ssr_lab.world.closed_sets import COLOURS, SHAPES


@pytest.mark.parametrize(("text", "expected"), [
    ("Dalí", "dali"), ("Jørn Utzon", "jorn utzon"), ("2,180 km/h", "2180 km h"),
    ("120.0 metres", "120 metres"),
    ("The Louvre.", "louvre"), ("four", "4"), ("  the   letter  X ", "letter x"), ("2.4 m", "2.4 m"),
    ("An oil on canvas", "oil on canvas"), ("", ""), ("A", "a"), ("the letter A", "letter a"),
])
def test_normalise(text: str, expected: str) -> None:
    assert normalise_answer(text) == expected


@pytest.mark.parametrize(("prediction", "gold", "aliases", "ok"), [
    ("1874", "1874", (), True),
    ("It was built in 1874.", "1874", (), True),
    ("1874 or 1875", "1874", (), False),
    ("1875", "1874", (), False),
    ("120", "120 metres", ("120", "120 m"), True),
    ("120 meters", "120 metres", ("120", "120 meters"), True),
    ("130 metres", "120 metres", ("120",), False),
    ("Four", "4", ("four",), True),
    ("the Orveld Museum", "the Orveld Museum", ("Orveld",), True),
    ("Vindmir", "Heiskand Vindmir", ("Vindmir",), True),
    ("red", "blue", (), False),
    ("A", "A", (), True),
    ("It shows the letter A", "A", (), True),
    ("E", "A", (), False),
    ("", "red", (), False),
    ("a very long answer that happens to mention red somewhere in it", "red", (), False),
])
def test_is_correct(prediction: str, gold: str, aliases: tuple[str, ...], ok: bool) -> None:
    assert is_correct(prediction, gold, aliases) is ok


def test_every_gold_answer_matches_itself_and_no_other_closed_value(questions: list[Question]) -> None:
    for q in questions:
        assert is_correct(q.answer, q.answer, q.aliases)
        assert all(is_correct(a, q.answer, q.aliases) for a in q.aliases)
        others = {"colours": COLOURS, "shapes": SHAPES}.get(q.answer_set, ())
        assert not any(is_correct(o, q.answer, q.aliases) for o in others if o != q.answer)

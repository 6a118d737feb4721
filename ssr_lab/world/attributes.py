"""Attribute specs: how a fact's value is drawn, phrased in the corpus and asked about.

Every fact sentence of an attribute contains its ``keyword``, and the gold text-search query of a
question about it is ``"<entity title> <keyword>"``: the words a searcher would type, and enough for
BM25 to rank the fact above the entity's other documents (the build checks this for every question).
Question stems hold ``{ref}`` (``this bridge`` or ``the Tresslin Bridge``); the *last* stem of every
attribute is reserved for the test split, so that part of the test phrasing is never seen in training.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Literal

from ssr_lab.world.names import FixedNames

ValueKind = Literal["year", "measure", "number", "person", "town", "choice", "month"]

MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December")
UNIT_ALIASES: dict[str, tuple[str, ...]] = {
    "metres": ("m", "meters", "metre", "meter"),
    "centimetres": ("cm", "centimeters"),
    "grams": ("g", "gram"),
    "years": ("year", "yrs"),
    "km/h": ("kmh", "kilometres per hour", "kilometers per hour", "kph"),
    "minutes": ("min", "mins", "minute"),
}


@dataclass(frozen=True)
class Value:
    """A fact's value as written in the corpus and in the gold answer, plus accepted variants."""

    text: str
    aliases: tuple[str, ...] = ()
    person_id: str = ""  # set when the value is one of the fixed people (two-hop questions start here)


@dataclass(frozen=True)
class AttributeSpec:
    key: str
    keyword: str
    kind: ValueKind
    facts: tuple[str, ...]
    questions: tuple[str, ...]
    lo: int = 0
    hi: int = 0
    step: int = 1
    unit: str = ""
    choices: tuple[str, ...] = ()
    profession: str = ""
    towns_as: str = "{town}"  # how a town value is phrased, e.g. "the marshes of {town}"
    seen_questions: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        if len(self.facts) < 2 or len(self.questions) < 3:
            raise ValueError(f"attribute {self.key!r} needs >= 2 fact phrasings and >= 3 question stems")
        for fact in self.facts:
            if self.keyword.lower() not in (fact + self.towns_as).lower():
                raise ValueError(f"attribute {self.key!r}: fact {fact!r} lacks the keyword {self.keyword!r}")
        object.__setattr__(self, "seen_questions", self.questions[:-1])


def measure_value(number: int, unit: str) -> Value:
    text = f"{number:,} {unit}" if number >= 10_000 else f"{number} {unit}"
    plain = text.rsplit(" ", 1)[0]
    return Value(text, (plain, *(f"{plain} {u}" for u in UNIT_ALIASES.get(unit, ()))))


def draw_value(spec: AttributeSpec, rng: random.Random, names: FixedNames) -> Value:
    """A random value of the attribute; people come from the fixed set, towns from the fixed towns."""
    if spec.kind == "year":
        return Value(str(rng.randint(spec.lo, spec.hi)))
    if spec.kind in ("measure", "number"):
        number = rng.randrange(spec.lo, spec.hi + 1, spec.step)
        if spec.kind == "number":
            return Value(str(number), (f"{number} {spec.unit}",) if spec.unit else ())
        return measure_value(number, spec.unit)
    if spec.kind == "person":
        people = [p for p in names.people if p.profession == spec.profession]
        person = rng.choice(people)
        surname = person.name.split()[-1]
        return Value(person.name, (surname,), person.id)
    if spec.kind == "town":
        town = rng.choice(names.towns)
        text = spec.towns_as.format(town=town)
        return Value(text, (town,) if text != town else ())
    if spec.kind == "month":
        return Value(rng.choice(MONTHS))
    return Value(rng.choice(spec.choices))


def _a(key: str, keyword: str, kind: ValueKind, facts: tuple[str, ...], questions: tuple[str, ...],
       **kw: object) -> AttributeSpec:
    return AttributeSpec(key, keyword, kind, facts, questions, **kw)  # type: ignore[arg-type]


PERSON_ATTRIBUTES: dict[str, AttributeSpec] = {
    "born": _a("born", "born", "year",
               ("{T} was born in {v}.", "The {profession} {t} was born in the year {v}.",
                "Records show that {t} was born in {v}."),
               ("In which year was {ref} born?", "When was {ref} born?", "What year was {ref} born in?",
                "{Ref} was born in which year?")),
    "birthplace": _a("birthplace", "birthplace", "town",
                     ("The birthplace of {t} was the town of {v}.", "{T} had {v} as a birthplace.",
                      "The {profession} {t} gave {v} as the birthplace."),
                     ("Where was {ref} born?", "What is the birthplace of {ref}?",
                      "In which town was {ref} born?", "{Ref} was born in which town?")),
}

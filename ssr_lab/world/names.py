"""Invented names from a syllable generator: entity stems, people and towns.

No model can know these words from pre-training, so a question about them can only be answered by
looking things up. Generation is seeded and uses only ``random.Random`` integer draws, whose sequence
Python keeps stable across versions and platforms, so a seed always gives the same names.

People and towns form a small *fixed* set (their own constant seed, whatever the world seed): people
are the makers behind many entities and are the second hop of two-hop questions.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

_ONSETS = ("b", "br", "c", "cl", "d", "dr", "f", "fr", "g", "gr", "h", "k", "l", "m", "n", "p", "pr",
           "r", "s", "st", "t", "tr", "v", "w", "th", "sh", "z", "qu")
_VOWELS = ("a", "e", "i", "o", "u", "ae", "ei", "ou", "ia", "y")
_CODAS = ("", "", "n", "r", "l", "s", "th", "m", "nd", "rn", "ld", "ss", "x", "ck", "rk", "lt", "sk")
_ENDINGS = ("in", "on", "ar", "el", "is", "and", "ow", "ick", "eth", "ard", "ley", "ven", "dor", "mir")

PERSON_SEED = 20_240_612  # constant: the same people and towns in every world
TOWN_COUNT = 120
PROFESSIONS: tuple[str, ...] = ("architect", "painter", "naturalist", "engineer", "chef", "botanist")
PEOPLE_PER_PROFESSION = 8


def _syllable(rng: random.Random) -> str:
    return rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)


def make_word(rng: random.Random, syllables: int) -> str:
    """A capitalised pronounceable word: ``syllables - 1`` syllables plus a common ending."""
    word = "".join(_syllable(rng) for _ in range(max(1, syllables - 1))) + rng.choice(_ENDINGS)
    return word[:1].upper() + word[1:]


class NameSource:
    """Hands out invented words that never repeat and never clash with words already taken."""

    def __init__(self, seed: int, taken: set[str] | None = None) -> None:
        self._rng = random.Random(seed)
        self._taken = {w.lower() for w in taken or set()}

    def take(self, syllables: tuple[int, ...] = (2, 2, 3)) -> str:
        while True:
            word = make_word(self._rng, self._rng.choice(syllables))
            if 5 <= len(word) <= 11 and word.lower() not in self._taken:
                self._taken.add(word.lower())
                return word


@dataclass(frozen=True)
class Person:
    """A maker behind entities (architect, painter, ...) with facts of their own."""

    id: str
    name: str
    profession: str
    born: int
    died: int
    birthplace: str


@dataclass(frozen=True)
class FixedNames:
    towns: tuple[str, ...]
    people: tuple[Person, ...]

    def taken(self) -> set[str]:
        """Every word in use, so entity stems stay distinct from people and towns."""
        words = set(self.towns)
        for p in self.people:
            words.update(p.name.split())
        return words


def fixed_names() -> FixedNames:
    """The towns and people shared by every world build (computed, not stored: a few ms)."""
    source = NameSource(PERSON_SEED)
    rng = random.Random(PERSON_SEED + 1)
    towns = tuple(source.take((2, 2, 3)) for _ in range(TOWN_COUNT))
    people = []
    for profession in PROFESSIONS:
        for _ in range(PEOPLE_PER_PROFESSION):
            name = f"{source.take((2,))} {source.take((2, 3))}"
            born = rng.randint(1780, 1940)
            person_id = "p-" + name.lower().replace(" ", "-")
            people.append(Person(person_id, name, profession, born, born + rng.randint(48, 92),
                                 rng.choice(towns)))
    return FixedNames(towns, tuple(people))

"""The world's entities: invented names in clusters of near-namesakes, their looks and their facts.

Entities sharing a stem ("Tresslin Bridge", "Tresslin Tower", "Tresslin carp") are near-namesakes:
searching for one also finds the others' documents, so the top hit is not always the right one.
Everything is drawn from ``random.Random(seed)`` in a fixed order, so a seed gives the same world.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from ssr_lab.world.attributes import Value, draw_value
from ssr_lab.world.categories import CATEGORIES, MOTIF_CATEGORY, MOTIFS
from ssr_lab.world.closed_sets import CHARS, COLOURS, SHAPES
from ssr_lab.world.names import FixedNames, NameSource
from ssr_lab.world.scene import Sign

URL_BASE = "https://world.ssr-server.invalid/wiki/"  # .invalid never resolves: no accidental fetches
CLUSTER_SIZES = (1, 1, 1, 2, 2, 3)  # how many entities share a stem, drawn uniformly


@dataclass(frozen=True)
class Look:
    """How an entity is drawn; every field is something a visual or detail question can ask about."""

    motif: str
    colour: str
    count: int
    sign: Sign
    plaque: str
    scene_seed: int


@dataclass(frozen=True)
class Fact:
    key: str
    value: Value
    phrasing: int  # which of the attribute's fact sentences the corpus uses


@dataclass(frozen=True)
class Entity:
    id: str
    title: str
    category: str
    look: Look
    facts: tuple[Fact, ...]
    stem: str = ""  # shared by near-namesakes; empty for knowledge entities
    article: str = "the"  # "" for titles that take none ("Concorde")
    knowledge: bool = False
    description: str = ""

    @property
    def url(self) -> str:
        return URL_BASE + self.id

    @property
    def the(self) -> str:
        """The title as used inside a sentence: "the Tresslin Bridge"."""
        return f"{self.article} {self.title}" if self.article else self.title

    def fact(self, key: str) -> Fact:
        for f in self.facts:
            if f.key == key:
                return f
        raise KeyError(f"entity {self.id!r} has no fact {key!r}")


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def draw_look(rng: random.Random, motif: str) -> Look:
    m = MOTIFS[motif]
    sign = Sign("shape", rng.choice(SHAPES)) if rng.random() < 0.5 else Sign("char", rng.choice(CHARS))
    return Look(motif, rng.choice(sorted(COLOURS)), rng.randint(m.min_count, 6), sign, rng.choice(CHARS),
                rng.getrandbits(63))


def singular(noun: str) -> str:
    return noun[:-2] if noun.endswith("ches") else noun[:-1] if noun.endswith("s") else noun


def counted(n: int, noun: str) -> str:
    """"1 window", "3 windows"."""
    return f"{n} {singular(noun) if n == 1 else noun}"


def a_an(word: str) -> str:
    return f"an {word}" if word[:1] in "aeiou" else f"a {word}"


def describe(the: str, look: Look) -> str:
    """A short visual description, shown by the image search next to the title."""
    m = MOTIFS[look.motif]
    parts = counted(look.count, m.count_noun)
    what = {"artwork": f"a painting in {a_an(look.colour)} frame showing {parts}",
            "dish": f"a dish served with {parts}",
            "plant": f"a plant with {parts}"}
    plain = f"{a_an(look.colour)} {m.ref_noun} with {parts}"
    return f"{the[:1].upper()}{the[1:]} is {what.get(MOTIF_CATEGORY[look.motif], plain)}."


def generate_entities(n: int, seed: int, names: FixedNames, reserved: set[str]) -> list[Entity]:
    """``n`` invented entities in clusters of near-namesakes, ids unique and stable for a seed."""
    rng = random.Random(seed)
    source = NameSource(seed ^ 0x5EED, names.taken() | reserved)
    motifs = sorted(MOTIFS)
    out: list[Entity] = []
    while len(out) < n:
        stem = source.take()
        size = min(rng.choice(CLUSTER_SIZES), n - len(out))
        for motif in rng.sample(motifs, size):
            out.append(_make_entity(rng, names, stem, motif))
    return out


def _make_entity(rng: random.Random, names: FixedNames, stem: str, motif: str) -> Entity:
    category = CATEGORIES[MOTIF_CATEGORY[motif]]
    title = f"{stem} {MOTIFS[motif].noun}"
    look = draw_look(rng, motif)
    facts = tuple(Fact(spec.key, draw_value(spec, rng, names), rng.randrange(len(spec.facts)))
                  for spec in category.attributes)
    return Entity(slug(title), title, category.name, look, facts, stem=stem,
                  description=describe(f"the {title}", look))

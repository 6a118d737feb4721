"""Categories of the world: their motifs (what is drawn and counted), attributes and wording."""

from __future__ import annotations

from dataclasses import dataclass

from ssr_lab.world import facts_built, facts_living
from ssr_lab.world.attributes import AttributeSpec


@dataclass(frozen=True)
class Motif:
    """One kind of picture in a category.

    ``noun`` ends the entity's title ("Tresslin *Bridge*"), ``count_noun`` names the repeated parts a
    count question asks about, ``colour_noun`` the part painted in the entity's colour.
    """

    name: str
    noun: str
    count_noun: str
    colour_noun: str
    ref_noun: str  # how a question about the picture names it: "this {ref_noun}"
    min_count: int = 1


@dataclass(frozen=True)
class Category:
    name: str
    motifs: tuple[Motif, ...]
    attributes: tuple[AttributeSpec, ...]
    person_attribute: str  # the attribute whose value is a person: the first hop of two-hop questions
    role: str  # how a two-hop question names that person, {ref} being the entity
    plaque_noun: str  # the small object carrying the detail character
    sign_place: str  # where the big sign stands, for visual questions

    def attribute(self, key: str) -> AttributeSpec:
        for spec in self.attributes:
            if spec.key == key:
                return spec
        raise KeyError(f"category {self.name!r} has no attribute {key!r}")


CATEGORIES: dict[str, Category] = {c.name: c for c in (
    Category("landmark", (
        Motif("tower", "Tower", "windows", "tower", "tower"),
        Motif("bridge", "Bridge", "arches", "bridge", "bridge"),
        Motif("lighthouse", "Lighthouse", "stripes", "stripes", "lighthouse"),
        Motif("gate", "Gate", "columns", "gate", "gate", min_count=2),
    ), facts_built.LANDMARK, "architect", "the architect of {ref}", "plaque", "next to the {noun}"),
    Category("artwork", (
        Motif("orchard", "Orchard", "trees", "frame", "painting"),
        Motif("harbour", "Harbour", "boats", "frame", "painting"),
        Motif("nocturne", "Nocturne", "stars", "frame", "painting"),
        Motif("flight", "Flight", "birds", "frame", "painting"),
    ), facts_built.ARTWORK, "painter", "the painter of {ref}", "label", "beside the {noun}"),
    Category("animal", (
        Motif("beetle", "beetle", "spots", "beetle", "beetle"),
        Motif("fish", "carp", "stripes", "fish", "fish"),
        Motif("caterpillar", "caterpillar", "segments", "caterpillar", "caterpillar", min_count=2),
    ), facts_living.ANIMAL, "described", "the naturalist who first described {ref}", "tag",
        "next to the {noun}"),
    Category("vehicle", (
        Motif("tram", "tram", "windows", "tram", "tram"),
        Motif("bus", "bus", "windows", "bus", "bus"),
        Motif("locomotive", "locomotive", "wheels", "locomotive", "locomotive", min_count=2),
        Motif("ferry", "ferry", "portholes", "ferry", "ferry"),
    ), facts_built.VEHICLE, "designer", "the engineer who designed {ref}", "badge", "next to the {noun}"),
    Category("dish", (
        Motif("platter", "platter", "dumplings", "plate", "dish"),
        Motif("soup", "soup", "slices", "bowl", "soup"),
        Motif("cake", "cake", "candles", "icing", "cake"),
    ), facts_living.DISH, "created", "the chef who created {ref}", "card", "beside the {noun}"),
    Category("plant", (
        Motif("flower", "lily", "flowers", "flowers", "plant"),
        Motif("cactus", "cactus", "arms", "pot", "cactus"),
        Motif("fruit_tree", "pear", "fruits", "fruits", "tree"),
    ), facts_living.PLANT, "described", "the botanist who first described {ref}", "tag",
        "next to the {noun}"),
)}

MOTIFS: dict[str, Motif] = {m.name: m for c in CATEGORIES.values() for m in c.motifs}
MOTIF_CATEGORY: dict[str, str] = {m.name: c.name for c in CATEGORIES.values() for m in c.motifs}

# How a search question refers to the pictured entity; the last form is kept for the test split.
PICTURE_REFS: tuple[str, ...] = ("this {noun}", "the {noun} in this picture", "the {noun} shown here",
                                 "the {noun} in the image")
GENERIC_NOUNS: dict[str, str] = {"landmark": "landmark", "artwork": "painting", "animal": "animal",
                                 "vehicle": "vehicle", "dish": "dish", "plant": "plant"}

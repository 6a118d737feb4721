"""The fixed set of well-known entities whose facts the training data teaches.

Real, famous things, described in our own words, identical in every world build (their looks come from
a constant seed, not the world's). A capable pre-trained model knows these facts, so answering them
from general knowledge is the right move; a small model learns them from the training split, where
every knowledge entity appears (they are the one exception to the split by entity). Only facts that
are well established are used; each uses the same attribute keys (and corpus phrasings) as invented
entities of its category.
"""

from __future__ import annotations

import random

from ssr_lab.world.attributes import Value, measure_value
from ssr_lab.world.categories import GENERIC_NOUNS
from ssr_lab.world.entities import Entity, Fact, draw_look, slug

KNOWLEDGE_SEED = 7_300_115
_V = Value


def _year(y: int) -> Value:
    return Value(str(y))


# (title, article, category, motif, {attribute key: value})
_TABLE: tuple[tuple[str, str, str, str, dict[str, Value]], ...] = (
    ("Eiffel Tower", "the", "landmark", "tower", {
        "located": _V("Paris"), "completed": _year(1889), "height": measure_value(330, "metres"),
        "material": _V("wrought iron", ("iron",))}),
    ("Statue of Liberty", "the", "landmark", "tower", {
        "located": _V("New York", ("New York City", "NYC")), "completed": _year(1886),
        "material": _V("copper")}),
    ("Great Pyramid of Giza", "the", "landmark", "gate", {
        "located": _V("Giza", ("Cairo",)), "material": _V("limestone"),
        "height": measure_value(146, "metres")}),
    ("Golden Gate Bridge", "the", "landmark", "bridge", {
        "located": _V("San Francisco"), "completed": _year(1937), "material": _V("steel")}),
    ("Taj Mahal", "the", "landmark", "gate", {
        "located": _V("Agra"), "material": _V("white marble", ("marble",))}),
    ("Sydney Opera House", "the", "landmark", "gate", {
        "located": _V("Sydney"), "completed": _year(1973),
        "architect": _V("Jørn Utzon", ("Utzon", "Jorn Utzon"))}),
    ("Colosseum", "the", "landmark", "bridge", {
        "located": _V("Rome"), "completed": _V("80 AD", ("80", "AD 80", "80 CE"))}),
    ("Leaning Tower of Pisa", "the", "landmark", "tower", {
        "located": _V("Pisa"), "material": _V("marble")}),
    ("Burj Khalifa", "the", "landmark", "tower", {
        "located": _V("Dubai"), "completed": _year(2010), "height": measure_value(828, "metres")}),
    ("Tower Bridge", "", "landmark", "bridge", {
        "located": _V("London"), "completed": _year(1894), "architect": _V("Horace Jones", ("Jones",))}),
    ("Mona Lisa", "the", "artwork", "orchard", {
        "painter": _V("Leonardo da Vinci", ("Leonardo", "da Vinci")),
        "museum": _V("the Louvre", ("Louvre", "Louvre Museum", "Musée du Louvre"))}),
    ("Starry Night", "The", "artwork", "nocturne", {
        "painter": _V("Vincent van Gogh", ("van Gogh", "Gogh")), "completed": _year(1889),
        "museum": _V("the Museum of Modern Art", ("MoMA", "Museum of Modern Art"))}),
    ("Great Wave off Kanagawa", "The", "artwork", "harbour", {
        "painter": _V("Katsushika Hokusai", ("Hokusai",)), "medium": _V("woodblock print", ("woodcut",))}),
    ("Scream", "The", "artwork", "flight", {
        "painter": _V("Edvard Munch", ("Munch",)), "completed": _year(1893)}),
    ("Girl with a Pearl Earring", "", "artwork", "orchard", {
        "painter": _V("Johannes Vermeer", ("Vermeer",)), "museum": _V("the Mauritshuis", ("Mauritshuis",)),
        "medium": _V("oil on canvas")}),
    ("Persistence of Memory", "The", "artwork", "nocturne", {
        "painter": _V("Salvador Dalí", ("Dali", "Dalí", "Salvador Dali")), "completed": _year(1931),
        "museum": _V("the Museum of Modern Art", ("MoMA", "Museum of Modern Art"))}),
    ("giant panda", "the", "animal", "beetle", {
        "diet": _V("bamboo"), "habitat": _V("the mountain forests of central China", ("China",))}),
    ("blue whale", "the", "animal", "fish", {
        "diet": _V("krill"), "habitat": _V("the open oceans", ("oceans", "ocean", "the ocean"))}),
    ("koala", "the", "animal", "caterpillar", {
        "diet": _V("eucalyptus leaves", ("eucalyptus",)),
        "habitat": _V("the eucalyptus forests of eastern Australia", ("Australia", "eastern Australia"))}),
    ("emperor penguin", "the", "animal", "fish", {"habitat": _V("Antarctica")}),
    ("axolotl", "the", "animal", "caterpillar", {
        "habitat": _V("the lakes of Xochimilco", ("Xochimilco", "Lake Xochimilco", "Mexico City"))}),
    ("Shinkansen", "the", "vehicle", "locomotive", {
        "introduced": _year(1964), "service": _V("Tokyo", ("Tokyo and Osaka",))}),
    ("Routemaster", "the", "vehicle", "bus", {"introduced": _year(1956), "service": _V("London")}),
    ("Titanic", "the", "vehicle", "ferry", {
        "introduced": _year(1912), "designer": _V("Thomas Andrews", ("Andrews",))}),
    ("Flying Scotsman", "the", "vehicle", "locomotive", {
        "introduced": _year(1923), "designer": _V("Nigel Gresley", ("Gresley", "Sir Nigel Gresley"))}),
    ("San Francisco cable car", "the", "vehicle", "tram", {
        "introduced": _year(1873), "designer": _V("Andrew Hallidie", ("Hallidie", "Andrew Smith Hallidie")),
        "service": _V("San Francisco")}),
    ("pizza Margherita", "the", "dish", "platter", {"origin": _V("Naples", ("Napoli",))}),
    ("paella", "", "dish", "soup", {"origin": _V("Valencia"), "ingredient": _V("rice")}),
    ("sushi", "", "dish", "platter", {"ingredient": _V("vinegared rice", ("rice", "sushi rice"))}),
    ("sunflower", "the", "plant", "flower", {"native": _V("North America", ("the Americas", "America"))}),
    ("saguaro", "the", "plant", "cactus", {"native": _V("the Sonoran Desert", ("Sonoran Desert",))}),
)


def knowledge_entities() -> list[Entity]:
    """The same list in every build; ids start with ``k-`` so they never clash with invented ones."""
    out = []
    for title, article, category, motif, values in _TABLE:
        rng = random.Random(f"{KNOWLEDGE_SEED}/{title}")
        look = draw_look(rng, motif)
        facts = tuple(Fact(key, value, rng.randrange(2)) for key, value in values.items())
        the = f"{article} {title}" if article else title
        description = f"{the[:1].upper()}{the[1:]} is a famous {GENERIC_NOUNS[category]}."
        out.append(Entity("k-" + slug(title), title, category, look, facts, article=article.lower(),
                          knowledge=True, description=description))
    return out


def knowledge_words() -> set[str]:
    """Words of the knowledge titles, kept out of invented names."""
    return {w for row in _TABLE for w in row[0].split()}

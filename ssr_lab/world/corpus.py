"""The text corpus: one document per description and per fact, plus deliberate distractors.

Documents are ``{"id", "title", "text", "url"}`` lines, the format ``LocalBM25.from_jsonl`` reads. Every
document's URL is unique, so an oracle can tell which document a search returned. Distractors:

* near-namesakes: entities sharing a stem have their own fact documents with the same words;
* a "not to be confused with" document per clustered entity, repeating one of its facts next to a
  namesake's full title, preferably a fact the namesake also has: searching the namesake's fact finds
  this document too, with the wrong value;
* people's documents name the entities they made, and their birth and death years sit side by side.
"""

from __future__ import annotations

import random
from collections import defaultdict

from ssr_lab.world.attributes import PERSON_ATTRIBUTES, AttributeSpec
from ssr_lab.world.categories import CATEGORIES
from ssr_lab.world.entities import Entity, Fact, a_an
from ssr_lab.world.names import Person
from ssr_lab.world.templates import capitalise

Doc = dict[str, str]


def spec_of(entity: Entity, key: str) -> AttributeSpec:
    return CATEGORIES[entity.category].attribute(key)


def fact_url(entity_url: str, key: str) -> str:
    return f"{entity_url}#{key}"


def fact_sentence(entity: Entity, fact: Fact) -> str:
    spec = spec_of(entity, fact.key)
    template = spec.facts[fact.phrasing % len(spec.facts)]
    return capitalise(template.format(T=capitalise(entity.the), t=entity.the, title=entity.title,
                                      v=fact.value.text, profession=""))


def person_url(person: Person) -> str:
    from ssr_lab.world.entities import URL_BASE

    return URL_BASE + person.id


def person_sentence(person: Person, key: str, phrasing: int) -> str:
    spec = PERSON_ATTRIBUTES[key]
    value = str(person.born) if key == "born" else person.birthplace
    template = spec.facts[phrasing % len(spec.facts)]
    return capitalise(template.format(T=person.name, t=person.name, title=person.name, v=value,
                                      profession=person.profession))


def person_phrasing(person: Person, key: str) -> int:
    """Which phrasing a person's fact uses: fixed per person, like the people themselves."""
    return random.Random(f"{person.id}/{key}").randrange(len(PERSON_ATTRIBUTES[key].facts))


def build_corpus(entities: list[Entity], people: tuple[Person, ...], seed: int) -> list[Doc]:
    rng = random.Random(seed ^ 0xC0FFEE)
    docs: list[Doc] = []
    clusters: dict[str, list[Entity]] = defaultdict(list)
    works: dict[str, list[Entity]] = defaultdict(list)
    for e in entities:
        if e.stem:
            clusters[e.stem].append(e)
        for f in e.facts:
            if f.value.person_id:
                works[f.value.person_id].append(e)
    for e in entities:
        docs.append({"id": f"{e.id}#description", "title": e.title, "text": e.description, "url": e.url})
        for f in e.facts:
            docs.append({"id": f"{e.id}#{f.key}", "title": e.title, "text": fact_sentence(e, f),
                         "url": fact_url(e.url, f.key)})
        mates = [m for m in clusters.get(e.stem, []) if m.id != e.id]
        if mates:
            mate = rng.choice(mates)
            shared = [f for f in e.facts if any(g.key == f.key for g in mate.facts)]
            fact = rng.choice(shared or list(e.facts))
            text = f"{fact_sentence(e, fact)} It is not to be confused with {mate.the}."
            docs.append({"id": f"{e.id}#namesake", "title": e.title, "text": text,
                         "url": fact_url(e.url, "namesake")})
    for p in people:
        made = works.get(p.id, [])[:2]
        known = f", known for {' and '.join(m.the for m in made)}" if made else ""
        url = person_url(p)
        docs.append({"id": f"{p.id}#description", "title": p.name,
                     "text": f"{p.name} was {a_an(p.profession)}{known}.", "url": url})
        for key in ("born", "birthplace"):
            docs.append({"id": f"{p.id}#{key}", "title": p.name,
                         "text": person_sentence(p, key, person_phrasing(p, key)), "url": fact_url(url, key)})
        docs.append({"id": f"{p.id}#died", "title": p.name, "text": f"{p.name} died in {p.died}.",
                     "url": fact_url(url, "died")})
    return docs

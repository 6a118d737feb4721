"""Questions of every kind with their gold moves, planned from the entities and the corpus.

Each invented entity gets a search, a named, a visual and a detail question, and a two-hop question
with probability ``TWO_HOP_SHARE``; knowledge questions are added per split in proportion. Phrasing
is drawn per entity from a seeded RNG; train and dev never use the last (held-out) stem or reference
form, test uses all of them. Zoom boxes depend on the rendered view and are filled in by the build.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from ssr_lab.world.attributes import PERSON_ATTRIBUTES
from ssr_lab.world.categories import CATEGORIES, GENERIC_NOUNS, MOTIFS, PICTURE_REFS
from ssr_lab.world.closed_sets import char_kind
from ssr_lab.world.corpus import fact_url, person_url
from ssr_lab.world.entities import Entity
from ssr_lab.world.names import Person
from ssr_lab.world.records import (
    FROM_EVIDENCE,
    FROM_IMAGE,
    FROM_KNOWLEDGE,
    IDENTIFY,
    LOOKUP,
    MOVE_ACTIONS,
    SPLITS,
    ZOOM,
    Move,
    Question,
)
from ssr_lab.world.templates import DETAIL, KNOWLEDGE_PICTURE_SHARE, VISUAL, fill, plural
from ssr_server.core.answers import NUMBER_WORDS

TWO_HOP_SHARE = 0.15
KNOWLEDGE_SHARE = 0.12  # knowledge questions per question about an invented entity, in each split
GENERIC_REF_SHARE = 0.3  # "this landmark" rather than "this bridge"


def _move(move: str, **kw: object) -> Move:
    return Move(move, MOVE_ACTIONS[move], **kw)  # type: ignore[arg-type]


class _Planner:
    def __init__(self, docs: dict[str, str], people: Sequence[Person]) -> None:
        self.docs = docs  # url -> text
        self.people = {p.id: p for p in people}
        self.out: list[Question] = []

    def pick(self, rng: random.Random, options: Sequence[str], test: bool) -> tuple[int, str]:
        """A stem or reference form; the last option is reserved for the test split."""
        i = rng.randrange(len(options) if test else len(options) - 1)
        return i, options[i]

    def add(self, e: Entity, split: str, kind: str, text: str, attribute: str, answer: str,
            aliases: Sequence[str], template: str, heldout: bool, moves: list[Move],
            answer_set: str = "") -> None:
        moves[-1].answer = answer  # every kind ends with an answer move carrying the gold answer
        self.out.append(Question("", split, kind, text, "", e.id, e.title, e.category, attribute, answer,
                                 list(aliases), answer_set, template, heldout, moves))

    def picture_ref(self, rng: random.Random, e: Entity, test: bool) -> tuple[int, str]:
        noun = MOTIFS[e.look.motif].ref_noun
        if e.knowledge or rng.random() < GENERIC_REF_SHARE:
            noun = GENERIC_NOUNS[e.category]
        i, form = self.pick(rng, PICTURE_REFS, test)
        return i, form.format(noun=noun)

    def lookup(self, e: Entity, key: str) -> Move:
        url = fact_url(e.url, key)
        spec = CATEGORIES[e.category].attribute(key)
        return _move(LOOKUP, query=f"{e.title} {spec.keyword}", expect_url=url, expect_text=self.docs[url])

    def fact_question(self, rng: random.Random, e: Entity, split: str, kind: str, key: str) -> None:
        test = split == "test"
        spec = CATEGORIES[e.category].attribute(key)
        si, stem = self.pick(rng, spec.questions, test)
        if kind == "named":
            ri, ref = 0, e.the
            moves = [self.lookup(e, key), _move(FROM_EVIDENCE)]
        else:
            ri, ref = self.picture_ref(rng, e, test)
            moves = [_move(IDENTIFY, expect_title=e.title), self.lookup(e, key), _move(FROM_EVIDENCE)]
        held = si == len(spec.questions) - 1 or (kind != "named" and ri == len(PICTURE_REFS) - 1)
        value = e.fact(key).value
        self.add(e, split, kind, fill(stem, ref=ref), key, value.text, value.aliases,
                 f"{kind}/{key}/{si}/{ri}", held, moves)

    def visual(self, rng: random.Random, e: Entity, split: str) -> None:
        m, cat, look = MOTIFS[e.look.motif], CATEGORIES[e.category], e.look
        aspect = rng.choice(("colour", "count", look.sign.kind))
        si, stem = self.pick(rng, VISUAL[aspect], split == "test")
        fields = {"cn": m.colour_noun, "be": "are" if plural(m.colour_noun) else "is", "cnt": m.count_noun,
                  "rn": m.ref_noun, "place": cat.sign_place.format(noun=m.ref_noun),
                  "kind": char_kind(look.sign.value)}
        answer, aliases, answer_set = {
            "colour": (look.colour, [], "colours"),
            "count": (str(look.count), [NUMBER_WORDS[look.count]], "counts"),
            "shape": (look.sign.value, [], "shapes"),
            "char": (look.sign.value, _char_aliases(look.sign.value), "chars"),
        }[aspect]
        self.add(e, split, "visual", fill(stem, **fields), aspect, answer, aliases,
                 f"visual/{aspect}/{si}", si == len(VISUAL[aspect]) - 1, [_move(FROM_IMAGE)], answer_set)

    def detail(self, rng: random.Random, e: Entity, split: str) -> None:
        pn = CATEGORIES[e.category].plaque_noun
        si, stem = self.pick(rng, DETAIL, split == "test")
        moves = [_move(ZOOM, label=f"small {pn}"), _move(FROM_IMAGE)]
        self.add(e, split, "detail", fill(stem, pn=pn, rn=MOTIFS[e.look.motif].ref_noun), "plaque",
                 e.look.plaque, _char_aliases(e.look.plaque), f"detail/{si}", si == len(DETAIL) - 1, moves,
                 "chars")

    def two_hop(self, rng: random.Random, e: Entity, split: str) -> None:
        test = split == "test"
        cat = CATEGORIES[e.category]
        person = self.people[e.fact(cat.person_attribute).value.person_id]
        key = rng.choice(("born", "birthplace"))
        spec = PERSON_ATTRIBUTES[key]
        si, stem = self.pick(rng, spec.questions, test)
        ri, ref = self.picture_ref(rng, e, test)
        url = f"{person_url(person)}#{key}"
        moves = [_move(IDENTIFY, expect_title=e.title), self.lookup(e, cat.person_attribute),
                 _move(LOOKUP, query=f"{person.name} {spec.keyword}", expect_url=url,
                       expect_text=self.docs[url]),
                 _move(FROM_EVIDENCE)]
        answer = str(person.born) if key == "born" else person.birthplace
        held = si == len(spec.questions) - 1 or ri == len(PICTURE_REFS) - 1
        self.add(e, split, "two_hop", fill(stem, ref=cat.role.format(ref=ref)),
                 f"{cat.person_attribute}>{key}", answer, [], f"two_hop/{key}/{si}/{ri}", held, moves)

    def knowledge(self, rng: random.Random, e: Entity, key: str, split: str) -> None:
        test = split == "test"
        spec = CATEGORIES[e.category].attribute(key)
        si, stem = self.pick(rng, spec.questions, test)
        ri, ref = (self.picture_ref(rng, e, test) if rng.random() < KNOWLEDGE_PICTURE_SHARE
                   else (-1, e.the))
        value = e.fact(key).value
        held = si == len(spec.questions) - 1 or ri == len(PICTURE_REFS) - 1
        self.add(e, split, "knowledge", fill(stem, ref=ref), key, value.text, value.aliases,
                 f"knowledge/{key}/{si}/{ri}", held, [_move(FROM_KNOWLEDGE)])


def _char_aliases(char: str) -> list[str]:
    return [NUMBER_WORDS[int(char)]] if char.isdigit() else []


def plan_questions(invented: Sequence[Entity], knowledge: Sequence[Entity], split_of: dict[str, str],
                   docs: dict[str, str], people: Sequence[Person], seed: int) -> list[Question]:
    """All questions, ids ``q000001``... in a fixed order; image paths ``views/<id>.jpg``."""
    p = _Planner(docs, people)
    per_split = dict.fromkeys(SPLITS, 0)
    for e in invented:
        rng = random.Random(f"{seed}/questions/{e.id}")
        split = split_of[e.id]
        before = len(p.out)
        first, second = rng.sample([s.key for s in CATEGORIES[e.category].attributes], 2)
        p.fact_question(rng, e, split, "search", first)
        p.fact_question(rng, e, split, "named", second)
        p.visual(rng, e, split)
        p.detail(rng, e, split)
        if rng.random() < TWO_HOP_SHARE:
            p.two_hop(rng, e, split)
        per_split[split] += len(p.out) - before
    pairs = [(k, f.key) for k in knowledge for f in k.facts]
    for split in SPLITS:
        rng = random.Random(f"{seed}/knowledge/{split}")
        order = rng.sample(pairs, len(pairs))
        for i in range(max(1, round(per_split[split] * KNOWLEDGE_SHARE)) if pairs else 0):
            k, key = order[i % len(order)]
            p.knowledge(rng, k, key, split)
    for n, q in enumerate(p.out, start=1):
        q.id = f"q{n:06d}"
        q.image = f"views/{q.id}.jpg"
    return p.out

"""Filling stems and taking filled questions apart again."""

from __future__ import annotations

import pytest

from ssr_lab.world.attributes import PERSON_ATTRIBUTES
from ssr_lab.world.categories import CATEGORIES, PICTURE_REFS
from ssr_lab.world.templates import DETAIL, VISUAL, fill, stem_fields, unfill, unfill_fields


@pytest.mark.parametrize("ref", ["the architect of the gate in this picture", "the Rossmir Bridge"])
def test_unfill_gives_back_what_fill_put_in(ref: str) -> None:
    stems = [s for spec in PERSON_ATTRIBUTES.values() for s in spec.questions]
    stems += [s for c in CATEGORIES.values() for spec in c.attributes for s in spec.questions]
    for stem in stems:
        assert unfill(stem, "ref", fill(stem, ref=ref)) == ref
    for form in PICTURE_REFS:
        assert unfill(form, "noun", form.format(noun="gate")) == "gate"
    assert unfill("When was {ref} born?", "ref", "Where was the painter of this painting born?") is None


def test_unfill_fields_gives_back_every_field_of_any_stem() -> None:
    values = {"cn": "roof", "be": "is", "cnt": "arms", "rn": "cactus", "place": "by the gate",
              "kind": "letter", "pn": "plaque"}
    for stem in [*DETAIL, *(s for stems in VISUAL.values() for s in stems)]:
        wanted = {f: values[f] for f in stem_fields(stem)}
        text = fill(stem, **wanted)
        assert unfill_fields(stem, text) == wanted, stem
        assert unfill_fields(stem, "So, " + text) is None
    # a field used twice holds one value; a stem written in lower case matches its capitalised text
    assert unfill_fields("{a} and {a}", "x and y") is None
    assert unfill_fields("{a} and {a}", "x and x") == {"a": "x"}
    assert unfill_fields("the {rn} here", "The cactus here") == {"rn": "cactus"}

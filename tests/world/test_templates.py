"""Filling stems and taking filled questions apart again."""

from __future__ import annotations

import pytest

from ssr_server.world.attributes import PERSON_ATTRIBUTES
from ssr_server.world.categories import CATEGORIES, PICTURE_REFS
from ssr_server.world.templates import fill, unfill


@pytest.mark.parametrize("ref", ["the architect of the gate in this picture", "the Rossmir Bridge"])
def test_unfill_gives_back_what_fill_put_in(ref: str) -> None:
    stems = [s for spec in PERSON_ATTRIBUTES.values() for s in spec.questions]
    stems += [s for c in CATEGORIES.values() for spec in c.attributes for s in spec.questions]
    for stem in stems:
        assert unfill(stem, "ref", fill(stem, ref=ref)) == ref
    for form in PICTURE_REFS:
        assert unfill(form, "noun", form.format(noun="gate")) == "gate"
    assert unfill("When was {ref} born?", "ref", "Where was the painter of this painting born?") is None

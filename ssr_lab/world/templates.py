"""Question stems of the kinds that do not come from an attribute: visual, detail and two-hop.

As with attribute stems, the *last* stem of every list is reserved for the test split. Fields:
``{cn}`` the coloured part, ``{be}`` "is"/"are" for it, ``{cnt}`` the counted parts, ``{rn}`` the
pictured thing, ``{place}`` where the sign stands, ``{kind}`` "number"/"letter", ``{pn}`` the plaque.
"""

from __future__ import annotations

import re
import string

VISUAL: dict[str, tuple[str, ...]] = {
    "colour": ("What colour {be} the {cn} in this picture?", "What is the colour of the {cn} shown here?",
               "Which colour {be} the {cn}?", "The {cn} in this image {be} what colour?"),
    "count": ("How many {cnt} does the {rn} in this picture have?", "How many {cnt} can you see on the {rn}?",
              "Count the {cnt} of the {rn}: how many are there?", "What is the number of {cnt} on the {rn}?"),
    "shape": ("What shape is shown on the sign {place}?", "Which shape is painted on the big sign?",
              "What shape does the sign in this picture show?", "The sign {place} shows which shape?"),
    "char": ("What {kind} is written on the sign {place}?", "Which {kind} does the big sign show?",
             "Read the large {kind} on the sign: what is it?", "The sign {place} shows which {kind}?"),
}
DETAIL: tuple[str, ...] = (
    "What is written on the small {pn}?", "Which character is printed on the little {pn} in this picture?",
    "What does the tiny {pn} near the {rn} say?", "The small {pn} shows which character?",
)
KNOWLEDGE_PICTURE_SHARE = 0.3  # knowledge questions that show the entity instead of naming it


def plural(noun: str) -> bool:
    return noun.endswith("s") and not noun.endswith("ss")


def capitalise(text: str) -> str:
    return text[:1].upper() + text[1:]


def unfill(template: str, field: str, text: str) -> str | None:
    """What ``{field}`` (or its capitalised ``{Field}``, given back in lower case) stood for in ``text``
    made from ``template`` by ``fill``; None when ``text`` was not made from ``template``."""
    big = "{" + capitalise(field) + "}"
    mark = big if big in template else "{" + field + "}"
    match = re.fullmatch(re.escape(template).replace(re.escape(mark), "(.+)"), text)
    if match is None:
        return None
    value = match.group(1)
    return value[:1].lower() + value[1:] if mark == big else value


def stem_fields(stem: str) -> frozenset[str]:
    """The names of ``stem``'s fields ("{cn}" -> "cn")."""
    return frozenset(f for _, f, _, _ in string.Formatter().parse(stem) if f)


def unfill_fields(stem: str, text: str) -> dict[str, str] | None:
    """Every field's value in ``text`` made from ``stem`` by ``str.format`` (a field used twice holds the
    same value both times), also when ``text`` was capitalised; None when ``text`` was not made from
    ``stem``. Values match as few characters as they can, left to right."""
    pattern, seen = "", set()
    for literal, field, _, _ in string.Formatter().parse(stem):
        pattern += re.escape(literal)
        if field:
            pattern += f"(?P={field})" if field in seen else f"(?P<{field}>.+?)"
            seen.add(field)
    match = re.fullmatch(pattern, text) or re.fullmatch(pattern, text[:1].lower() + text[1:])
    return match.groupdict() if match else None


def fill(stem: str, **fields: str) -> str:
    """Fill a stem; ``{Ref}`` and ``{Role}`` are the capitalised ``{ref}`` and ``{role}``."""
    extra = {k[:1].upper() + k[1:]: capitalise(v) for k, v in fields.items() if k in ("ref", "role")}
    return capitalise(stem.format(**fields, **extra))

"""Field types the recipes share: names lists, question kinds, zoom styles, bounded numbers.

Each type carries its own check, so an error names the field it is about; each accepts the natural YAML
form of its value (a list, or a comma-separated string for a list of names; a mapping for kind repeats)
and keeps the tuple form the trainers have always read, so configs still hash and print as before.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, PlainSerializer

from ssr_lab.world.records import KINDS
from ssr_lab.world.views import ZOOM_STYLES, check_zoom_style

# Unknown keys are refused (a misspelt key would otherwise train the default silently).
RECIPE = ConfigDict(extra="forbid")

Share = Annotated[float, Field(ge=0.0, le=1.0)]


def _listed(value: Any) -> Any:
    """``"a,b"`` as ``("a", "b")``: a list of names also reads as one ``--set key=a,b`` value."""
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


def _as_text(value: Any) -> Any:
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def _kind_pairs(value: Any) -> Any:
    """``{two_hop: 8, search: 2}`` (the YAML form) as ``(("two_hop", 8), ("search", 2))``."""
    return tuple(value.items()) if isinstance(value, Mapping) else value


def _known_kinds(pairs: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
    kinds = [kind for kind, _ in pairs]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown kinds {', '.join(unknown)} (kinds: {', '.join(KINDS)})")
    if len(set(kinds)) < len(kinds):
        raise ValueError("a kind is given twice")
    return pairs


def _kinds(kinds: tuple[str, ...]) -> tuple[str, ...]:
    _known_kinds(tuple((kind, 1) for kind in kinds))
    return kinds


def one_of(allowed: tuple[str, ...], what: str) -> AfterValidator:
    """A non-empty tuple of names, each one of ``allowed``."""

    def check(chosen: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [name for name in chosen if name not in allowed]
        if not chosen or unknown:
            raise ValueError(f"unknown {what} {', '.join(unknown) or '(none given)'}; "
                             f"{what}: some of {', '.join(allowed)}")
        return chosen

    return AfterValidator(check)


Names = Annotated[tuple[str, ...], BeforeValidator(_listed)]
Text = Annotated[str, BeforeValidator(_as_text)]  # a path kept as text (a model folder or a shape)
ZoomStyle = Annotated[str, AfterValidator(check_zoom_style),
                      Field(json_schema_extra={"form": " | ".join(ZOOM_STYLES)})]
Kinds = Annotated[tuple[str, ...], BeforeValidator(_listed), AfterValidator(_kinds)]
KindRepeats = Annotated[
    tuple[tuple[str, Annotated[int, Field(ge=1)]], ...],
    BeforeValidator(_kind_pairs), AfterValidator(_known_kinds),
    PlainSerializer(lambda pairs: dict(pairs), return_type=dict[str, int]),
]
IntPair = Annotated[tuple[Annotated[int, Field(ge=0)], Annotated[int, Field(ge=0)]], BeforeValidator(_listed)]

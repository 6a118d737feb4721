"""A recipe's keys as a reader needs them: each field's YAML type, bounds, default and help text.

What ``--help`` showed for each option when the fields were options; ``ssr-lab train recipe-fields``
prints it, read from the config dataclass itself so that it cannot drift from what is validated.
"""

from __future__ import annotations

import json
import textwrap
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from ssr_lab.train.config.recipe import as_recipe


@dataclass(frozen=True)
class FieldDoc:
    name: str
    type: str  # as a recipe writes it: int, path, ssr | freeform, [int, int], {KIND: N, ...}
    default: str | None  # YAML text; None: required
    description: str


def _type_text(annotation: Any) -> str:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return " | ".join(str(a) for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join("null" if a is type(None) else _type_text(a) for a in args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"[{_type_text(args[0])}, ...]"
        return "[" + ", ".join(_type_text(a) for a in args) + "]"
    if hasattr(annotation, "__metadata__"):  # Annotated[...] inside a tuple: its bounds are shown below
        return _type_text(args[0])
    if annotation is Path:
        return "path"
    return getattr(annotation, "__name__", str(annotation))


def _bounds(info: FieldInfo) -> str:
    marks = {Ge: ">=", Gt: ">", Le: "<=", Lt: "<"}
    found = [f"{sign} {getattr(m, type(m).__name__.lower())}" for m in info.metadata
             for kind, sign in marks.items() if isinstance(m, kind)]
    return f" ({', '.join(found)})" if found else ""


def _yaml_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def describe(cls: type[Any]) -> list[FieldDoc]:
    """The fields of a recipe config, in their order."""
    fields: dict[str, FieldInfo] = cls.__pydantic_fields__
    required = [name for name, info in fields.items() if info.default is PydanticUndefined]
    # Defaults in their YAML form (a tuple of pairs reads as a mapping): dump a config with the required
    # fields filled in, then read its other fields back.
    sample = cls(**{name: "." for name in required})
    defaults = as_recipe(sample)
    docs = []
    for name, info in fields.items():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        kind = str(extra.get("form") or _type_text(info.annotation)) + _bounds(info)
        docs.append(FieldDoc(name, kind, None if name in required else _yaml_text(defaults[name]),
                             info.description or ""))
    return docs


def format_fields(cls: type[Any], width: int = 100) -> str:
    lines = []
    for doc in describe(cls):
        default = "required" if doc.default is None else f"default {doc.default}"
        lines += [f"{doc.name}: {doc.type}; {default}",
                  *textwrap.wrap(doc.description, width, initial_indent="    ", subsequent_indent="    ")]
    return "\n".join(lines)

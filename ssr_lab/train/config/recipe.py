"""Training recipes: YAML files read into a command's config dataclass, with ``extends`` and ``--set``.

A recipe is a mapping of its config's fields. ``extends: FILE`` (a path relative to the recipe) starts from
another recipe's fields, so that a lineage step states only what changed; a key stated replaces the
inherited value whole (a mapping such as ``repeat`` is not merged into its parent's: the file says what the
step ran with). ``--set key=value`` pairs, their values read as YAML, come last. Unknown keys are refused
where they appear, with the config's keys listed; the config's own checks then name the field at fault.
Paths in fields (``world``, ``init``, ``out``) are read as given, from the directory the command runs in,
as the command line's were.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import TypeAdapter, ValidationError

T = TypeVar("T")
EXTENDS = "extends"


class RecipeError(ValueError):
    """A recipe that cannot be read or that its config refuses; the message names the file or the field."""


def field_names(cls: type[Any]) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _check_keys(cls: type[Any], keys: Sequence[Any], where: str) -> None:
    unknown = [str(k) for k in keys if k not in field_names(cls)]
    if unknown:
        raise RecipeError(f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                          f"known keys: {', '.join(field_names(cls))}")


def read_recipe(cls: type[Any], path: Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The fields ``path`` states, over those of the recipes it extends (not yet validated)."""
    where = path.resolve()
    if where in _seen:
        chain = " -> ".join(str(p) for p in (*_seen, where))
        raise RecipeError(f"{path}: extends itself through {chain}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise RecipeError(f"{path}: cannot read the recipe ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise RecipeError(f"{path}: not YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise RecipeError(f"{path}: a recipe is a mapping of keys to values, not {type(data).__name__}")
    fields = dict(data)
    parent = fields.pop(EXTENDS, None)
    _check_keys(cls, list(fields), str(path))
    if parent is None:
        return fields
    if not isinstance(parent, str):
        raise RecipeError(f"{path}: extends takes one recipe file, relative to this one")
    return {**read_recipe(cls, path.parent / parent, (*_seen, where)), **fields}


def parse_sets(items: Sequence[str]) -> dict[str, Any]:
    """``key=value`` pairs, each value read as YAML (``[1, 2]``, ``{two_hop: 8}``, ``null``, ``0.5``)."""
    out: dict[str, Any] = {}
    for item in items:
        key, eq, text = item.partition("=")
        if not eq or not key.strip():
            raise RecipeError(f"--set {item!r}: takes KEY=VALUE")
        try:
            out[key.strip()] = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise RecipeError(f"--set {item!r}: the value is not YAML: {exc}") from None
    return out


def explain(exc: ValidationError) -> str:
    """Every error of ``exc``, each led by the field it is about (a cross-field check names its own)."""
    lines = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(part) for part in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "missing":
            message = f"required: state it in the recipe or --set {where}=..."
        lines.append(f"{where}: {message}" if where else message)
    return "; ".join(lines)


def validate(cls: type[T], fields: Mapping[str, Any], where: str = "recipe") -> T:
    """``fields`` as a ``cls``: every field's type and bounds, then its cross-field checks."""
    _check_keys(cls, list(fields), where)
    try:
        return TypeAdapter(cls).validate_python(dict(fields))
    except ValidationError as exc:
        raise RecipeError(f"{where}: {explain(exc)}") from None


def load(cls: type[T], path: Path, sets: Sequence[str] = ()) -> T:
    """The config a recipe file and ``--set`` pairs make."""
    overrides = parse_sets(sets)
    _check_keys(cls, list(overrides), "--set")
    where = f"recipe {path}" + (" with --set" if overrides else "")
    return validate(cls, {**read_recipe(cls, path), **overrides}, where)


def as_recipe(cfg: Any) -> dict[str, Any]:
    """Every field of ``cfg`` in its YAML form (paths as text, tuples as lists, kind repeats as a mapping):
    a recipe that makes ``cfg`` again."""
    return dict(TypeAdapter(type(cfg)).dump_python(cfg, mode="json"))


def dump_fields(fields: Mapping[str, Any]) -> str:
    """One ``key: value`` line per field, values in YAML's flow form (``[1, 2]``, ``{two_hop: 8}``)."""
    lines = []
    for key, value in fields.items():
        text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10**6)
        lines.append(f"{key}: {text.removesuffix(chr(10)).removesuffix(chr(10) + '...')}")
    return "\n".join(lines) + "\n"


def dump(cfg: Any) -> str:
    """``cfg`` as a recipe file: every field, in the config's order."""
    return dump_fields(as_recipe(cfg))

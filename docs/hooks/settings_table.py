"""mkdocs hook: the configuration page's table of settings, generated from the settings model.

``docs/configuration.md`` holds the marker below; at build time it becomes one row per field of
``ssr_server.core.config.Settings``: the environment variable, the type (with its bounds), the default
and the field's description. The table therefore cannot drift from the code. The build fails when the
page lost its marker or a field has no description.
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any

import annotated_types
from mkdocs.exceptions import PluginError
from pydantic import SecretStr
from pydantic.fields import FieldInfo

from ssr_server.core.config import Settings

MARKER = "<!-- settings-table -->"
PAGE = "configuration.md"
ENV_PREFIX = "SSR_"

_BOUNDS: tuple[tuple[type[Any], str, str], ...] = (
    (annotated_types.Ge, "ge", ">="),
    (annotated_types.Gt, "gt", ">"),
    (annotated_types.Le, "le", "<="),
    (annotated_types.Lt, "lt", "<"),
)


def env_var(name: str) -> str:
    return ENV_PREFIX + name.upper()


def type_text(annotation: Any) -> str:
    """A short, readable type: ``int``, ``str | unset``, ``torch | sglang``, ``list of str (JSON)``."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(str(a) for a in args)
    if origin in (types.UnionType, typing.Union):
        parts = [type_text(a) for a in args if a is not type(None)]
        optional = len(parts) < len(args)
        return " | ".join(parts) + (" or unset" if optional else "")
    if origin is tuple:
        return f"list of {type_text(args[0])} (JSON)"
    if annotation is SecretStr:
        return "str (secret)"
    return getattr(annotation, "__name__", str(annotation))


def bounds_text(field: FieldInfo) -> str:
    found = []
    for meta in field.metadata:
        for cls, attr, sign in _BOUNDS:
            if isinstance(meta, cls):
                found.append(f"{sign} {getattr(meta, attr)}")
    return ", ".join(found)


def default_text(name: str, field: FieldInfo) -> str:
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if isinstance(value, tuple):
        return "`" + json.dumps(list(value)) + "`"
    if isinstance(value, bool):
        return "`" + str(value).lower() + "`"
    if isinstance(value, int) and name.endswith("_bytes") and value % (1024 * 1024) == 0:
        return f"`{value}` ({value // (1024 * 1024)} MiB)"
    return f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("\n", " ")


def settings_table() -> str:
    """The Markdown table of every setting, in the model's order."""
    rows = ["| variable | type | default | what it does |", "|---|---|---|---|"]
    for name, field in Settings.model_fields.items():
        if not field.description:
            raise PluginError(f"Settings.{name} has no description (ssr_server/core/config.py)")
        kind = type_text(field.annotation)
        bounds = bounds_text(field)
        if bounds:
            kind = f"{kind}, {bounds}"
        rows.append(f"| `{env_var(name)}` | {_cell(kind)} | {_cell(default_text(name, field))} | "
                    f"{_cell(field.description)} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, /, *, page: Any, config: Any, files: Any) -> str:
    """mkdocs event: put the table where the configuration page has the marker."""
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise PluginError(f"{PAGE} lost its marker {MARKER!r}: the settings table has nowhere to go")
    return markdown.replace(MARKER, settings_table())

"""The configuration page cannot drift from the settings: every field is described, and the mkdocs hook
that writes the page's table (``docs/hooks/settings_table.py``) renders every one of them."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from ssr_server.core.config import Settings

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "docs" / "hooks" / "settings_table.py"
PAGE = ROOT / "docs" / "configuration.md"


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("settings_table_hook", HOOK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", list(Settings.model_fields))
def test_every_setting_has_a_description(name: str) -> None:
    description = Settings.model_fields[name].description
    assert description and len(description.split()) >= 3, f"Settings.{name} needs a description"


def test_the_hook_renders_one_row_per_setting() -> None:
    table = _hook().settings_table()
    rows = [line for line in table.splitlines() if line.startswith("| `SSR_")]
    assert [row.split("`")[1] for row in rows] == [f"SSR_{name.upper()}" for name in Settings.model_fields]
    assert "| `SSR_PORT` | int, &gt;= 0, &lt;= 65535 | `8000` |" in table  # HTML-escaped in cells
    assert "| `SSR_MODEL` | str or unset | unset |" in table


def test_the_page_keeps_the_marker_and_the_hook_is_registered() -> None:
    hook = _hook()
    assert hook.MARKER in PAGE.read_text(encoding="utf-8")
    assert "docs/hooks/settings_table.py" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")


def test_the_hook_replaces_the_marker_only_on_its_page() -> None:
    hook = _hook()

    class File:
        def __init__(self, src_uri: str) -> None:
            self.src_uri = src_uri

    class Page:
        def __init__(self, src_uri: str) -> None:
            self.file = File(src_uri)

    text = f"before\n\n{hook.MARKER}\n\nafter"
    rendered = hook.on_page_markdown(text, page=Page("configuration.md"), config=None, files=None)
    assert hook.MARKER not in rendered and "`SSR_ENGINE`" in rendered
    assert hook.on_page_markdown(text, page=Page("index.md"), config=None, files=None) == text

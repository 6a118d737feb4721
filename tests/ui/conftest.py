"""The run viewer's tests: Debian's chromium (``/usr/bin/chromium``, installed by scripts/test.sh) driven by
Playwright (no browser download), against real servers keeping their runs in a temporary SQLite file."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Module-scoped: Playwright's sync API runs an event loop in this thread while it is open, and the
    session's fixtures close with asyncio.run, so it must be gone before they are."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no {CHROMIUM} (Debian package chromium; scripts/test.sh installs it with apt-get)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        # --no-sandbox: the suite may run as root, where chromium's sandbox refuses to start
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def _store_fixtures() -> Any:
    """tests/store/conftest.py's servers and gated search, shared here (a conftest is not importable)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "store" / "conftest.py"
    spec = importlib.util.spec_from_file_location("ssr_store_test_fixtures", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_store = _store_fixtures()
stored, library_dir, kit, search, demo_png_b64 = (
    _store.stored, _store.library_dir, _store.kit, _store.search, _store.demo_png_b64)


@pytest.fixture(scope="module")
def shipped(demo_tools: Any, library_dir: Any) -> Iterator[Any]:
    """``with shipped(store_url) as url:`` a real server on the shipped trained model (ssr-tiny) and the
    demo world's tools, keeping its runs in ``store_url``."""
    import asyncio
    import contextlib
    import threading

    from ssr_server.bench.serve import live_server
    from ssr_server.core.config import Settings
    from ssr_server.engine.factory import resolve_model
    from ssr_server.engine.torch.engine import TorchEngine

    engine = TorchEngine(resolve_model(Settings()))

    @contextlib.contextmanager
    def _serve(store_url: str) -> Iterator[str]:
        with live_server(Settings(run_store=store_url), engine, demo_tools) as url:
            yield url

    yield _serve
    # closed on a thread of its own: Playwright's sync API may still hold this thread's event loop
    closer = threading.Thread(target=lambda: asyncio.run(engine.close()))
    closer.start()
    closer.join(60)


@pytest.fixture(scope="session")
def demo_question() -> dict[str, Any]:
    """The demo's headline question (a landmark's height from its picture alone), as a run request."""
    import base64

    from ssr_server.tools.demo import shipped_demo_world, showcase_question

    world = shipped_demo_world()
    q = showcase_question(world.questions())
    image = base64.b64encode((world.root / q.image).read_bytes()).decode()
    return {"question": q.question, "images": [image], "mode": "ssr"}

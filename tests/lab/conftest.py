"""The lab's shared fixture: the demo preset of the benchmark world, built by the lab into a folder of
the session's own (lab code writes caches beside a world, so the shipped read-only copy is not used)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def world_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo preset of the benchmark world on disk (questions, corpus, image index, views)."""
    from ssr_lab.world import demo_world

    return demo_world(tmp_path_factory.mktemp("world") / "demo").root

"""Fixtures of the agent tests: one intra-op torch thread, the agent around the session engine."""

from __future__ import annotations

from typing import Any

import pytest

from ssr_server.agent.loop import Agent
from ssr_server.core.library import LibraryRegistry
from ssr_server.core.protocol import ImageRef
from ssr_server.tools.demo import demo_picture, shipped_demo_world


@pytest.fixture(scope="session")
def tokenizer(torch_engine: Any) -> Any:
    return torch_engine.tokenizer


@pytest.fixture(scope="session")
def demo_image() -> ImageRef:
    return ImageRef.from_pil(demo_picture(shipped_demo_world().entity_ids()[0]))


@pytest.fixture(scope="session")
def second_image() -> ImageRef:
    return ImageRef.from_pil(demo_picture(shipped_demo_world().entity_ids()[1]))


@pytest.fixture(scope="session")
def agent(torch_engine: Any, demo_tools: Any) -> Agent:
    return Agent(torch_engine, demo_tools, LibraryRegistry())

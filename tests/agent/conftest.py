"""Fixtures of the agent tests: one intra-op torch thread, the agent around the session engine."""

from __future__ import annotations

from typing import Any

import pytest

from ssr_server.agent.loop import Agent
from ssr_server.engine.base import ImageRef
from ssr_server.library import LibraryRegistry
from ssr_server.world import demo_entities, demo_picture


@pytest.fixture(scope="session")
def tokenizer(torch_engine: Any) -> Any:
    return torch_engine.tokenizer


@pytest.fixture(scope="session")
def demo_image() -> ImageRef:
    return ImageRef.from_pil(demo_picture(demo_entities()[0].id))


@pytest.fixture(scope="session")
def second_image() -> ImageRef:
    return ImageRef.from_pil(demo_picture(demo_entities()[1].id))


@pytest.fixture(scope="session")
def agent(torch_engine: Any, demo_tools: Any) -> Agent:
    return Agent(torch_engine, demo_tools, LibraryRegistry())

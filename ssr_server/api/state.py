"""What the routes share for the app's life: settings, engine, agent, tools, admission, intake."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx
from fastapi import Request

from ssr_server.agent.completion import Completer, ReasoningMemory
from ssr_server.agent.loop import Agent
from ssr_server.api.admission import Admission
from ssr_server.api.shutdown import Drain
from ssr_server.api.stats import LatencyWindow
from ssr_server.core.config import Settings
from ssr_server.core.images.intake import load_image
from ssr_server.core.images.limits import ImageLimits
from ssr_server.core.library import LibraryRegistry
from ssr_server.core.protocol import Engine, ImageRef
from ssr_server.store.base import RunStore
from ssr_server.tools.registry import ToolRegistry


@dataclass
class AppState:
    settings: Settings
    engine: Engine
    agent: Agent
    libraries: LibraryRegistry
    tools: ToolRegistry
    admission: Admission
    stats: LatencyWindow
    image_limits: ImageLimits
    http: httpx.AsyncClient
    drain: Drain
    completer: Completer  # the OpenAI route's turn
    reasoning_memory: ReasoningMemory  # reasoning of returned tool calls, by call id
    started: int  # unix time (GET /v1/models)
    store: RunStore | None = None  # the run store (None: SSR_RUN_STORE=off)
    # stored runs in flight in this process, by id (cancel, drain); the ids cancelled through the API
    in_flight: dict[str, asyncio.Task[object]] = field(default_factory=dict)
    cancel_asked: set[str] = field(default_factory=set)

    async def load_images(self, specs: Sequence[str]) -> list[ImageRef]:
        """A request's images, through the one safe intake (size, pixel and URL limits), concurrently."""
        return list(await asyncio.gather(*(load_image(s, self.image_limits, self.http) for s in specs)))


def app_state(request: Request) -> AppState:
    """The state the lifespan built: a route runs only after the lifespan started."""
    state: AppState = request.app.state.ssr
    return state

"""What the routes share for the app's life: settings, engine, agent, tools, admission, intake."""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from ssr_server.agent.completion import Completer, ReasoningMemory
from ssr_server.agent.loop import Agent
from ssr_server.api.admission import Admission
from ssr_server.api.images import ImageLimits
from ssr_server.api.shutdown import Drain
from ssr_server.api.stats import LatencyWindow
from ssr_server.config import Settings
from ssr_server.engine.base import Engine
from ssr_server.library import LibraryRegistry
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

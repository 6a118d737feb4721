"""What several commands share: settings from options and the in-process agent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

MODEL_HELP = "model dir or hub id (default: the shipped trained model; tiny-random: the random tiny one)"


def make_settings(**overrides: Any) -> Any:
    """The server's settings (SSR_* variables), with the options a user gave on top."""
    from ssr_server.core.config import Settings

    return Settings(**{k: v for k, v in overrides.items() if v is not None})


def local_agent(settings: Any, world: Path | None = None) -> Any:
    """The agent on the configured embedded engine, tools from ``world`` (a ``world build`` folder) or
    the settings (the demo world when none is set), libraries and format from the settings."""
    from ssr_server.agent.loop import Agent
    from ssr_server.api.app import build_tools
    from ssr_server.core.formats.format import get_format
    from ssr_server.core.library import LibraryRegistry
    from ssr_server.engine.factory import build_engine
    from ssr_server.tools.registry import build_registry

    engine = build_engine(settings)
    tools = (build_registry(corpus_path=world / "corpus.jsonl", image_index_dir=world / "images")
             if world is not None else build_tools(settings))
    return Agent(engine, tools, LibraryRegistry(settings.library_dirs),
                 get_format(settings.prompt_format, settings.format_dirs))

"""Build the configured engine (embedded torch, or an SGLang client)."""

from __future__ import annotations

from pathlib import Path

from ssr_server.core.config import Settings
from ssr_server.core.protocol import Engine
from ssr_server.engine.tiny import default_tiny_dir, ensure_tiny_model
from ssr_server.models import RANDOM_MODEL, default_model_dir


def resolve_model(settings: Settings) -> str:
    """The model to load: the configured one; unset, the shipped trained default; ``tiny-random``, the
    random tiny model (built on first use into the cache)."""
    if settings.model == RANDOM_MODEL:
        target = Path(settings.cache_dir) / "tiny-qwen3-vl" if settings.cache_dir else default_tiny_dir()
        return str(ensure_tiny_model(target))
    if settings.model:
        return settings.model
    return str(default_model_dir())


def build_engine(settings: Settings) -> Engine:
    if settings.engine == "sglang":
        from ssr_server.engine.sglang.client import SGLangEngine

        return SGLangEngine(settings.sglang_url, model=resolve_model(settings),
                            scoring=settings.sglang_scoring, timeout_s=settings.sglang_timeout_s)
    from ssr_server.engine.torch.config import EngineConfig
    from ssr_server.engine.torch.engine import TorchEngine

    return TorchEngine(resolve_model(settings), EngineConfig.from_settings(settings))

"""Settings: every knob in one place, read from the environment (prefix ``SSR_``) or a .env file."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SSR_", env_file=".env", extra="ignore")

    # engine
    engine: Literal["torch", "sglang"] = "torch"
    model: str | None = Field(None, description="local dir or hub id; unset = the offline tiny Qwen3-VL")
    dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    device: str = "cpu"
    torch_threads: int | None = None
    bf16_matmul: Literal["auto", "native", "fp32"] = "auto"  # CPU without bf16 arithmetic: fp32 kernel
    prefix_cache_mb: int = Field(1024, ge=1)
    sglang_url: str = "http://127.0.0.1:30000"
    sglang_scoring: Literal["auto", "route", "generate"] = "auto"  # /ssr/score, or two /generate calls
    sglang_timeout_s: float = Field(120.0, gt=0)
    cache_dir: str | None = None  # tiny model and demo assets (default ~/.cache/ssr-server)

    # http
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_key: SecretStr | None = None
    open_paths: tuple[str, ...] = ("/health", "/ready", "/metrics")
    cors_origins: tuple[str, ...] = ()

    # agent and tools
    library_dirs: tuple[str, ...] = ()
    default_library: str = "default"
    searxng_url: str | None = None
    image_search_url: str | None = None
    corpus_path: str | None = None
    image_index_dir: str | None = None
    tool_timeout_s: float = Field(20.0, gt=0)

    # limits
    max_body_bytes: int = Field(20 * 1024 * 1024, ge=1024)
    max_image_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    max_image_pixels: int = Field(16_000_000, ge=1)
    max_images: int = Field(4, ge=0)
    max_question_chars: int = Field(4000, ge=1)
    max_candidates: int = Field(16, ge=1)
    max_candidate_chars: int = Field(400, ge=1)
    max_turns: int = Field(12, ge=1, le=32)
    max_messages: int = Field(64, ge=1)

    # image URLs
    allow_private_urls: bool = False
    url_allowlist: tuple[str, ...] = ()  # domains; empty = any public host
    url_timeout_s: float = Field(10.0, gt=0)
    url_max_redirects: int = Field(3, ge=0)

    # admission, deadlines, shutdown
    max_concurrent_runs: int = Field(16, ge=1)
    max_queued_runs: int = Field(64, ge=0)
    run_deadline_s: float = Field(300.0, gt=0)
    drain_timeout_s: float = Field(30.0, ge=0)
    stats_window: int = Field(2000, ge=10)

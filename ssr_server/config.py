"""Settings: every knob in one place, read from the environment (prefix ``SSR_``) or a .env file."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from ssr_server.limits import MAX_CANDIDATE_CHARS, MAX_CANDIDATES, MAX_TURNS


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SSR_", env_file=".env", extra="ignore")

    # engine
    engine: Literal["torch", "sglang"] = "torch"
    model: str | None = Field(None, description="local dir or hub id; unset = the shipped trained model; "
                                "tiny-random = the random tiny Qwen3-VL")
    dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    device: str = "cpu"
    torch_threads: int | None = None
    bf16_matmul: Literal["auto", "native", "fp32"] = "auto"  # CPU without bf16 arithmetic: fp32 kernel
    prefix_cache_mb: int = Field(128, ge=1)  # KV kept across requests (raise it for real models)
    # embedded engine scheduler (see engine/torch/config.py)
    max_batched_tokens: int = Field(8192, ge=1)  # tokens per forward
    max_batched_seqs: int = Field(256, ge=1)  # decode steps, score jobs and prefills per forward
    prefill_chunk_tokens: int = Field(512, ge=1)  # longer prefills are chunked and paced
    max_decode_slowdown: float = Field(1.5, ge=0)  # a paced prefill chunk may slow a forward this much
    max_context: int | None = Field(None, ge=2)  # unset = the model's max_position_embeddings
    sglang_url: str = "http://127.0.0.1:30000"
    sglang_scoring: Literal["auto", "route", "generate"] = "auto"  # /ssr/score, or two /generate calls
    sglang_timeout_s: float = Field(120.0, gt=0)
    cache_dir: str | None = None  # tiny model and demo assets (default ~/.cache/ssr-server)

    # http
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_key: SecretStr | None = None
    open_paths: tuple[str, ...] = ("/health", "/ready", "/metrics")

    # agent and tools
    library_dirs: tuple[str, ...] = ()
    default_library: str = "default"
    generic_library: str = "generic-1"  # OpenAI route: tool sets that are not ours
    served_model_name: str | None = None  # OpenAI route's model id (unset: the model path or "ssr-tiny")
    reasoning_memory_size: int = Field(4096, ge=0)  # OpenAI route: reasoning kept per returned tool call
    prompt_format: str = "ssr"  # a folder under ssr_server/formats (or in format_dirs)
    format_dirs: tuple[str, ...] = ()
    searxng_url: str | None = None
    image_search_url: str | None = None
    corpus_path: str | None = None
    image_index_dir: str | None = None
    tool_timeout_s: float = Field(20.0, gt=0)

    # limits
    max_body_bytes: int = Field(20 * 1024 * 1024, ge=1024)
    max_image_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    max_image_pixels: int = Field(16_000_000, ge=1)
    # What the server keeps of an image: larger ones are downscaled at intake (the model, zoom and
    # image search then work at this resolution); bounds the memory of every admitted run.
    image_keep_pixels: int | None = Field(524_288, ge=1024)
    image_decode_concurrency: int = Field(2, ge=1)  # images decoded at once (each up to 48 MB + copies)
    max_images: int = Field(4, ge=0)
    max_question_chars: int = Field(4000, ge=1)
    max_candidates: int = Field(MAX_CANDIDATES, ge=1, le=MAX_CANDIDATES)
    max_candidate_chars: int = Field(MAX_CANDIDATE_CHARS, ge=1, le=MAX_CANDIDATE_CHARS)
    max_turns: int = Field(12, ge=1, le=MAX_TURNS)
    max_messages: int = Field(64, ge=1)
    max_conversation_chars: int = Field(64_000, ge=1)  # text of all messages (selection, OpenAI routes)

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

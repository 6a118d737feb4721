"""Settings: every knob in one place, read from the environment (prefix ``SSR_``) or a .env file.

Every field carries a ``description``: the docs site's configuration page is generated from them
(``docs/hooks/settings_table.py``), so a new setting needs one.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from ssr_server.core.limits import MAX_CANDIDATE_CHARS, MAX_CANDIDATES, MAX_TURNS


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SSR_", env_file=".env", extra="ignore")

    # engine
    engine: Literal["torch", "sglang"] = Field(
        "torch", description="torch: the embedded engine, in process; sglang: an SGLang server or router "
        "(SSR_SGLANG_URL)")
    model: str | None = Field(None, description="local dir or hub id; unset = the shipped trained model; "
                                "tiny-random = the random tiny Qwen3-VL")
    dtype: Literal["fp32", "bf16", "fp16"] = Field("fp32", description="embedded engine: the weights' dtype")
    device: str = Field("cpu", description="embedded engine: the torch device (cpu, cuda, cuda:1, ...)")
    torch_threads: int | None = Field(
        None, description="embedded engine: torch intra-op threads; unset = torch's default (all cores). "
        "On a machine shared with other CPU-heavy processes, 1 is often faster")
    bf16_matmul: Literal["auto", "native", "fp32"] = Field(
        "auto", description="bf16 on a CPU without bf16 arithmetic: auto routes bf16 matmuls of 8 rows or "
        "more through the fp32 kernel (exact upcast, bf16 result), except with exact drafts (the kernel "
        "would change with the row count); native never does; fp32 always does. On a "
        "CPU with bf16 arithmetic, auto packs the linear weights once for oneDNN (same results, faster "
        "decoding, a second copy of those weights in memory); native keeps PyTorch's plain kernel")
    prefix_cache_mb: int = Field(
        128, ge=1, description="embedded engine: the prefix KV cache's bound in MB (LRU), kept across "
        "requests; raise it for real models")
    # embedded engine scheduler (see engine/torch/config.py)
    max_batched_tokens: int = Field(8192, ge=1, description="embedded engine: tokens per forward")
    max_batched_seqs: int = Field(
        256, ge=1, description="embedded engine: decode steps, score jobs and prefills per forward")
    prefill_chunk_tokens: int = Field(
        512, ge=1, description="embedded engine: longer prefills are chunked and paced")
    max_decode_slowdown: float = Field(
        1.5, ge=0, description="embedded engine: a paced prefill chunk may slow a forward this much "
        "(x a forward without it); 0 = fixed chunks")
    max_heavy_delay: float = Field(
        0.0, ge=0, description="embedded engine: while a selection or a picture's prefill waits, decode "
        "steps and action prompts go first until they have cost this many times its forward; 0 = one "
        "light forward, then the heavy one")
    slice_selections: bool = Field(
        False, description="embedded engine: while decode steps or action prompts wait, each forward "
        "carries them and a slice of the waiting selections (at least one candidate) instead of a "
        "selection whole: faster actions under concurrency, slower selections; ignored by exact engines")
    max_context: int | None = Field(
        None, ge=2, description="longest context (images expanded, plus the candidates or the tokens to "
        "decode); longer ones are refused with 400 context_too_long before any work; unset = the model's "
        "max_position_embeddings")
    speculative_tokens: int = Field(
        8, ge=0, le=64, description="embedded engine: draft tokens verified per decode step (jump-forward "
        "and prompt lookup; outputs are unchanged, forwards are saved); 0 = one token per forward")
    prefill_lane: Literal["auto", "on", "off"] = Field(
        "off", description="embedded engine: run heavy forwards (a selection with its observation's "
        "prefill, a context prefilled whole) on a second thread while decode steps go on: faster actions "
        "and runs under concurrency, slower selections; auto = on with SSR_TORCH_THREADS=1 on a machine "
        "with 2 cores or more")
    speculative_branches: int = Field(
        16, ge=0, le=64, description="embedded engine: where a grammar forces nothing and admits 2 to this "
        "many tokens next (a number's digits), draft one branch per admitted token and keep the one the "
        "model picks (a tree verified in one forward); 0 = linear drafts only")
    jump_forward: bool = Field(
        True, description="embedded engine: draft the text a grammar forces (a tool call's keys and "
        "brackets)")
    prompt_lookup: bool = Field(
        True, description="embedded engine: draft by n-gram lookup in the run's own context (names and "
        "answers copied from observations)")
    exact_drafts: Literal["auto", "on", "off"] = Field(
        "auto", description="embedded engine: compute each draft row as a one-token decode step would "
        "(linear drafts, no trees; a forward of one row computed as two), so that drafts never change the "
        "text in reduced precision; auto = on for bf16 and fp16 when drafts are on, off for fp32 (where "
        "the drafts' kernels have not changed a turn)")
    sglang_url: str = Field(
        "http://127.0.0.1:30000", description="the SGLang server or router (engine sglang)")
    sglang_scoring: Literal["auto", "route", "generate"] = Field(
        "auto", description="how candidates are scored on SGLang: route = our /ssr/score route "
        "(ssr-server sglang-launch); generate = two standard /generate calls (behind SGLang's router); "
        "auto = the route, falling back to generate on a 404")
    sglang_timeout_s: float = Field(120.0, gt=0, description="timeout of one request to SGLang, in seconds")
    cache_dir: str | None = Field(
        None, description="where the random tiny model (tiny-random) is built on first use; unset = "
        "$XDG_CACHE_HOME/ssr-server, or ~/.cache/ssr-server")

    # http
    host: str = Field("127.0.0.1", description="address ssr-server serve listens on")
    port: int = Field(8000, ge=0, le=65535, description="port ssr-server serve listens on")
    log_format: Literal["text", "json"] = Field(
        "text", description="text: plain log lines; json: one JSON object a line, with a line per request "
        "and per finished run carrying the trace id (traces themselves are set by the standard OTEL_* "
        "variables, see the monitoring page)")
    api_key: SecretStr | None = Field(
        None, description="when set, every route but SSR_OPEN_PATHS needs Authorization: Bearer <key>")
    open_paths: tuple[str, ...] = Field(
        ("/health", "/ready", "/metrics"), description="routes that need no API key")

    # agent and tools
    library_dirs: tuple[str, ...] = Field(
        (), description="extra folders of rationale libraries (YAML, or the SSR harness's JSON)")
    default_library: str = Field(
        "default", description="the rationale library a request gets when it names none")
    generic_library: str = Field(
        "generic-1", description="OpenAI route: the library for tool sets that are not ours")
    served_model_name: str | None = Field(
        None, description="OpenAI route's model id; unset = SSR_MODEL, or ssr-tiny when that is unset")
    reasoning_memory_size: int = Field(
        4096, ge=0, description="OpenAI route: returned tool calls whose selected reasoning the server "
        "remembers (by call id), so clients need not send it back")
    prompt_format: str = Field(
        "ssr", description="the prompt format: a folder under ssr_server/core/formats (or in "
        "SSR_FORMAT_DIRS)")
    format_dirs: tuple[str, ...] = Field((), description="extra folders of prompt formats")
    searxng_url: str | None = Field(
        None, description="text search through a SearxNG instance (wins over SSR_CORPUS_PATH); none of the "
        "four tool backends set = the shipped offline demo world")
    image_search_url: str | None = Field(
        None, description="image search through an HTTP backend (wins over SSR_IMAGE_INDEX_DIR)")
    corpus_path: str | None = Field(
        None, description="text search: local BM25 over this JSONL corpus (a world's corpus.jsonl)")
    image_index_dir: str | None = Field(
        None, description="image search: local perceptual-hash index of this folder (a world's folder)")
    tool_timeout_s: float = Field(20.0, gt=0, description="timeout of one tool call, in seconds")

    # limits
    max_body_bytes: int = Field(20 * 1024 * 1024, ge=1024, description="largest request body")
    max_image_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="largest image, encoded")
    max_image_pixels: int = Field(16_000_000, ge=1, description="largest image, decoded (pixels)")
    # What the server keeps of an image: larger ones are downscaled at intake (the model, zoom and
    # image search then work at this resolution); bounds the memory of every admitted run.
    image_keep_pixels: int | None = Field(
        524_288, ge=1024, description="images over this many pixels are downscaled at intake (aspect "
        "kept): the model, zoom and image search then work at that size, and each running run holds its "
        "images at it (about 3 MB per megapixel)")
    image_decode_concurrency: int = Field(
        2, ge=1, description="images decoded at once (each up to 48 MB + copies)")
    max_images: int = Field(4, ge=0, description="images per request")
    max_question_chars: int = Field(4000, ge=1, description="characters of a run's question")
    max_candidates: int = Field(
        MAX_CANDIDATES, ge=1, le=MAX_CANDIDATES, description="explicit candidates per request")
    max_candidate_chars: int = Field(
        MAX_CANDIDATE_CHARS, ge=1, le=MAX_CANDIDATE_CHARS, description="characters of one candidate")
    max_turns: int = Field(
        12, ge=1, le=MAX_TURNS, description="the most turns a request may ask for (a run without max_turns "
        "gets 6, or this if lower)")
    max_messages: int = Field(64, ge=1, description="messages of one selection or chat request")
    max_conversation_chars: int = Field(
        64_000, ge=1, description="text of all messages (selection, OpenAI routes)")

    # image URLs
    allow_private_urls: bool = Field(
        False, description="fetch image URLs on private, loopback and link-local addresses (SSRF guard off)")
    url_allowlist: tuple[str, ...] = Field(
        (), description="domains images may be fetched from (subdomains included); empty = any public host")
    url_timeout_s: float = Field(10.0, gt=0, description="timeout of one image download, in seconds")
    url_max_redirects: int = Field(3, ge=0, description="redirects followed when fetching an image URL")

    # admission, deadlines, shutdown
    max_concurrent_runs: int = Field(
        16, ge=1, description="requests served at once: agent runs, selection steps, chat turns")
    max_queued_runs: int = Field(
        64, ge=0, description="requests waiting for a slot; beyond that, 429 with Retry-After")
    run_deadline_s: float = Field(
        300.0, gt=0, description="a run still going after this many seconds ends (outcome timeout)")
    drain_timeout_s: float = Field(
        30.0, ge=0, description="on SIGTERM, how long runs in flight may finish before they are cancelled")

    # connections: slow and idle clients (ssr-server serve's uvicorn protocol)
    body_timeout_s: float = Field(
        30.0, gt=0, description="a request body must have arrived this many seconds after the server began "
        "to read it (for a run: once admitted), else 408, the connection closed and the slot freed; the "
        "rest of a refused body is discarded as it streams, within the same time")
    header_timeout_s: float = Field(
        10.0, gt=0, description="a request's line and headers must have arrived this many seconds after the "
        "connection opened or the request's first byte, else the connection is closed")
    keep_alive_s: float = Field(
        5.0, gt=0, description="an idle keep-alive connection is closed after this many seconds")
    max_connections: int = Field(
        1000, ge=1, description="open connections (keep it under the process's file limit); a request on "
        "a connection beyond this gets a plain 503")
    max_header_bytes: int = Field(
        65_536, ge=1024, description="request line and headers of one request; beyond this, 431 and the "
        "connection closed")
    stats_window: int = Field(
        2000, ge=10, description="/v1/stats: percentiles are over this many latest values of each latency, "
        "per mode")

    # the run store (ssr_server/store, docs/operations/run-store.md)
    run_store: str = Field(
        "sqlite", description="where runs are kept: sqlite (runs.sqlite3 under the cache dir), "
        "sqlite:///PATH, postgresql://USER:PASSWORD@HOST:PORT/DB (several replicas), or off (runs are "
        "answered and forgotten, no background runs)")
    run_store_max_runs: int = Field(
        100_000, ge=0, description="finished runs kept (the oldest go first); 0 = no limit")
    run_store_ttl_s: float = Field(
        30 * 86400.0, ge=0, description="finished runs older than this many seconds are deleted; 0 = kept")
    run_store_max_image_bytes: int = Field(
        1_000_000, ge=4096, description="the most bytes kept of one image of a stored run (PNG, or JPEG "
        "made smaller until it fits)")
    run_store_heartbeat_s: float = Field(
        10.0, gt=0, description="how often a server marks itself alive in the store and applies retention; "
        "runs of a server silent for 3 heartbeats (or whose process on this host is gone) become "
        "interrupted")

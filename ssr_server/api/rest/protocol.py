"""The REST API's requests and responses: the only place its input is validated by pydantic (bounds from
``core.limits``, so the schema and the engine-side checks agree); inside, the server works on dataclasses."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ssr_server.agent.trace import Outcome
from ssr_server.api.fields import Text
from ssr_server.core.limits import (
    DEFAULT_REASONING_TOKENS,
    MAX_ALPHA,
    MAX_REASONING_TOKENS,
    MAX_SEED,
    MAX_TAU,
    MAX_TURNS,
)
from ssr_server.core.selection import DEFAULT_ALPHA, DEFAULT_TAU


class _Strict(BaseModel):
    # A field a client misspells is an error, not a default silently used.
    model_config = ConfigDict(extra="forbid")


class RunRequest(_Strict):
    question: Text = Field(..., min_length=1, description="the question about the images")
    images: list[str] = Field(default_factory=list,
                              description="base64, data: URL or http(s) URL, one per image")
    mode: Literal["ssr", "freeform"] = "ssr"
    library: str | None = Field(None, description="rationale library name (default: the server's)")
    candidates: list[Text] | None = Field(None, description="explicit rationale texts instead of a library")
    label_only: bool = False
    tau: float = Field(DEFAULT_TAU, ge=0.0, le=MAX_TAU)
    alpha: float = Field(DEFAULT_ALPHA, ge=0.0, le=MAX_ALPHA)
    max_turns: int | None = Field(None, ge=1, le=MAX_TURNS)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    reasoning_budget: int = Field(DEFAULT_REASONING_TOKENS, ge=1, le=MAX_REASONING_TOKENS)
    action_temperature: float = Field(0.0, ge=0.0, le=10.0,
                                      description="0: greedy actions; > 0 samples the action tokens")
    stream: bool = False
    store: bool = Field(True, description="keep the run in the run store (GET /v1/agent/runs/{id}); "
                                          "ignored when the server keeps no runs (SSR_RUN_STORE=off)")
    background: bool = Field(False, description="answer 202 with the run's id at once and run it in the "
                                                "background (needs the run store; not with stream)")


class TurnOut(BaseModel):
    index: int
    mode: str
    candidate_id: str | None
    reasoning: str
    scores: list[float] | None
    q: list[float] | None
    left_out: dict[str, str] = Field(
        default_factory=dict, description="candidates not scored this turn, by id, and why (e.g. a zoom "
                                          "in a run without an image); scores and q skip them")
    action_type: str | None
    tool_name: str | None
    argument: str
    arguments: dict[str, Any] | None
    action_text: str
    observation: str
    observation_ok: bool
    tool_data: dict[str, Any] | None
    reasoning_span: tuple[int, int] | None
    action_span: tuple[int, int] | None
    error: str | None
    context_tokens: int
    cached_tokens: int
    scored_tokens: int
    reasoning_tokens: int
    action_tokens: int
    action_forwards: int = Field(0, description="decode forwards the action took (fewer than its tokens "
                                 "when drafts are verified: jump-forward, prompt lookup)")
    reasoning_s: float
    action_s: float
    tool_s: float
    turn_s: float


class Usage(BaseModel):
    prompt_tokens: int
    scored_tokens: int
    generated_tokens: int


class Timings(BaseModel):
    total_s: float
    model_s: float
    tool_s: float


class RunResponse(BaseModel):
    id: str
    question: str
    mode: str
    library: str
    outcome: Outcome
    answer: str | None
    error: str | None
    turns: list[TurnOut]
    timings: Timings
    usage: Usage


class ContentPart(_Strict):
    type: Literal["text", "image"]
    text: Text | None = None
    image: str | None = Field(None, description="base64, data: URL or http(s) URL")


class Message(_Strict):
    role: Literal["system", "user", "assistant"]
    content: Text | list[ContentPart]


class SelectRequest(_Strict):
    messages: list[Message] = Field(..., min_length=1)
    library: str | None = None
    candidates: list[Text] | None = None
    label_only: bool = False
    tau: float = Field(DEFAULT_TAU, ge=0.0, le=MAX_TAU)
    alpha: float = Field(DEFAULT_ALPHA, ge=0.0, le=MAX_ALPHA)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)


class SelectResponse(BaseModel):
    index: int
    candidate_id: str
    text: str
    action: str
    scores: list[float]
    q: list[float]
    logprob_sums: list[float]
    token_counts: list[int]
    context_tokens: int
    latency_s: float


class LibraryOut(BaseModel):
    name: str
    description: str
    candidates: list[dict[str, str]]


class ErrorBody(BaseModel):  # the one error shape, as api.errors writes it
    code: str
    message: str
    details: Any | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody

"""The OpenAI chat-completions request, as pydantic models (the fields we honour; others are ignored).

Fields that would change the answer's meaning and that we cannot honour (``n`` > 1, ``logprobs``, a
structured ``response_format``) are refused by the route with a 400 rather than silently ignored. The
responses are plain dicts (``reply``): they are streamed chunk by chunk, and OpenAI's own shape is the
contract, not a schema of ours.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ssr_server.api.fields import Text
from ssr_server.core.limits import DEFAULT_REASONING_TOKENS, MAX_ALPHA, MAX_REASONING_TOKENS, MAX_TAU
from ssr_server.core.selection import DEFAULT_ALPHA, DEFAULT_TAU


class _Loose(BaseModel):
    """OpenAI clients send fields we do not use (``user``, ``metadata``, ``store``...): ignored."""

    model_config = ConfigDict(extra="ignore")


class ImageURL(_Loose):
    url: str = Field(..., description="http(s) URL or data: URL")
    detail: str | None = None


class TextPart(_Loose):
    type: Literal["text"]
    text: Text


class ImagePart(_Loose):
    type: Literal["image_url"]
    image_url: ImageURL


Part = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class FunctionCall(_Loose):
    name: str
    arguments: str = "{}"


class ToolCallIn(_Loose):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Loose):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[Part] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: Text | None = None


class FunctionDef(_Loose):
    name: str = Field(..., pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: Text = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class ToolDef(_Loose):
    type: Literal["function"]
    function: FunctionDef


class _Named(_Loose):
    name: str


class NamedToolChoice(_Loose):
    type: Literal["function"]
    function: _Named


class StreamOptions(_Loose):
    include_usage: bool = False


class SSRExtension(BaseModel):
    """Our extension (``extra_body={"ssr": {...}}`` with the openai client)."""

    model_config = ConfigDict(extra="forbid")
    library: str | None = None
    candidates: list[Text] | None = None
    mode: Literal["ssr", "freeform"] = "ssr"
    tau: float = Field(DEFAULT_TAU, ge=0.0, le=MAX_TAU)
    alpha: float = Field(DEFAULT_ALPHA, ge=0.0, le=MAX_ALPHA)
    reasoning_budget: int = Field(DEFAULT_REASONING_TOKENS, ge=1, le=MAX_REASONING_TOKENS)


class ResponseFormat(_Loose):
    type: str = "text"


class ChatCompletionRequest(_Loose):
    model: str
    messages: list[ChatMessage] = Field(..., min_length=1)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    seed: int | None = None  # any integer, as OpenAI accepts (folded onto 64 bits)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1)
    logprobs: bool | None = None
    response_format: ResponseFormat | None = None
    ssr: SSRExtension | None = None

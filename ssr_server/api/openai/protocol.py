"""The OpenAI chat-completions request, as pydantic models (the fields we honour; others are ignored).

The schema describes a valid request precisely enough for a generator (schemathesis, a client generator)
to write one from it alone: messages by role (what content parts each role may carry; a system or
developer message only first; a tool message with its ``tool_call_id``), the tools' parameters as an
object schema, ``tool_choice``, ``stream_options``. Where the route refuses a value with a message of its
own, the schema only documents the bound (``_documented``) and the route's check stays the one that
answers, in OpenAI's error shape: ``n`` > 1, ``logprobs``, a structured ``response_format``, an image URL
of another scheme, candidates the library check refuses.

What depends on the server (the served model's id, its libraries) cannot be written here:
``describe_server`` narrows a generated OpenAPI document to one server's values.

Fields that would change the answer's meaning and that we cannot honour are refused by the route with a
400 rather than silently ignored. The responses are plain dicts (``reply``): they are streamed chunk by
chunk, and OpenAI's own shape is the contract, not a schema of ours.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, GetJsonSchemaHandler, WithJsonSchema
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from ssr_server.api.fields import Text
from ssr_server.core.limits import (
    DEFAULT_REASONING_TOKENS,
    MAX_ALPHA,
    MAX_CANDIDATE_CHARS,
    MAX_CANDIDATES,
    MAX_REASONING_TOKENS,
    MAX_TAU,
)
from ssr_server.core.selection import DEFAULT_ALPHA, DEFAULT_TAU

TOOL_NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
IMAGE_URL_PATTERN = r"^(https?://|data:image/[A-Za-z0-9.+-]+;base64,)"
# A candidate the library check accepts: one line, not blank, no markup (documented without any '<').
CANDIDATE_PATTERN = r"^[^\x00-\x1f\x7f-\x9f<]*[^\s\x00-\x1f\x7f-\x9f<][^\x00-\x1f\x7f-\x9f<]*$"
JSON_TYPES = ("string", "integer", "number", "boolean", "array", "object", "null")


def _documented(schema: dict[str, Any]) -> Any:
    """The field's JSON schema as written here; its validation stays pydantic's (looser), so that what
    the route refuses on purpose is refused by its own check, with its own message."""
    return WithJsonSchema(schema)


class _Loose(BaseModel):
    """OpenAI clients send fields we do not use (``user``, ``metadata``, ``store``...): ignored."""

    model_config = ConfigDict(extra="ignore")


class ImageURL(_Loose):
    url: Annotated[str, _documented({
        "type": "string", "pattern": IMAGE_URL_PATTERN,
        "description": "an http(s) URL, or the image as a data URL (data:image/png;base64,...)"})]
    detail: Annotated[str | None, _documented({
        "anyOf": [{"type": "string", "enum": ["auto", "low", "high"]}, {"type": "null"}],
        "description": "ignored: the image is read at the engine's resolution"})] = None


class TextPart(_Loose):
    type: Literal["text"]
    text: Text


class ImagePart(_Loose):
    type: Literal["image_url"]
    image_url: ImageURL


Part = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class FunctionCall(_Loose):
    name: str
    arguments: Annotated[str, _documented({
        "type": "string", "default": "{}", "pattern": r"^\s*\{[\s\S]*\}\s*$",
        "description": "the arguments, a JSON object as text"})] = "{}"


class ToolCallIn(_Loose):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


class SystemMessage(_Loose):
    """A system message (``developer`` is its name for OpenAI's newer models): the first message only."""

    role: Literal["system", "developer"]
    content: Text | list[TextPart]
    name: str | None = None


class UserMessage(_Loose):
    role: Literal["user"]
    content: Text | list[Part]
    name: str | None = None


class AssistantMessage(_Loose):
    """An earlier turn: its answer (``content``) or its tool calls; ``reasoning_content`` is optional
    (the server restores the reasoning of the calls it returned)."""

    role: Literal["assistant"]
    content: Text | list[TextPart] | None = None
    tool_calls: list[ToolCallIn] | None = None
    reasoning_content: Text | None = None
    name: str | None = None


class ToolMessage(_Loose):
    """A tool's result, answering the call ``tool_call_id``."""

    role: Literal["tool"]
    content: Text | list[TextPart]
    tool_call_id: str = Field(..., min_length=1)


ChatMessage = Annotated[SystemMessage | UserMessage | AssistantMessage | ToolMessage,
                        Field(discriminator="role")]


class _SystemFirst:
    """The ``messages`` array's schema: any message first, then no system (or developer) message. The
    route refuses one elsewhere with its own message; this only says so to a generator."""

    def __get_pydantic_json_schema__(self, core: CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        schema = handler(core)
        items = schema.get("items", {})
        variants, discriminator = items.get("oneOf"), items.get("discriminator")
        if not isinstance(variants, list) or not isinstance(discriminator, dict):
            return schema
        mapping: dict[str, str] = discriminator.get("mapping", {})
        # the system message's (placeholder) reference, whatever name it ends up under
        system = {mapping.get("system"), mapping.get("developer")}
        schema["prefixItems"] = [items]
        schema["items"] = {"oneOf": [v for v in variants if v.get("$ref") not in system],
                           "discriminator": {**discriminator, "mapping": {
                               k: v for k, v in mapping.items() if v not in system}}}
        return schema


_PROPERTY: dict[str, Any] = {
    "type": "object",
    "properties": {
        "type": {"type": "string", "enum": list(JSON_TYPES)},
        "description": {"type": "string"},
        "title": {"type": "string"},
        "enum": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "default": {},
    },
    "required": ["type"],
}
_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "description": "the arguments' JSON schema, of type object: the arguments are decoded under it",
    "properties": {
        "type": {"type": "string", "const": "object"},
        "properties": {"type": "object", "additionalProperties": _PROPERTY},
        "required": {"type": "array", "items": {"type": "string"}},
        "additionalProperties": {"type": "boolean"},
        "title": {"type": "string"},
        "description": {"type": "string"},
    },
    "default": {"type": "object", "properties": {}},
}


class FunctionDef(_Loose):
    name: str = Field(..., pattern=TOOL_NAME_PATTERN)
    description: Text = ""
    parameters: Annotated[dict[str, Any], _documented(_PARAMETERS)] = Field(
        default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None


class ToolDef(_Loose):
    type: Literal["function"]
    function: FunctionDef


class _Named(_Loose):
    name: str = Field(..., pattern=TOOL_NAME_PATTERN)


class NamedToolChoice(_Loose):
    type: Literal["function"]
    function: _Named


class StreamOptions(_Loose):
    include_usage: bool = False


class SSRExtension(BaseModel):
    """Our extension (``extra_body={"ssr": {...}}`` with the openai client)."""

    model_config = ConfigDict(extra="forbid")
    library: Annotated[str | None, _documented({
        "anyOf": [{"type": "string", "pattern": r"^[a-z0-9][a-z0-9_-]*$", "maxLength": 64},
                  {"type": "null"}],
        "description": "a rationale library of this server (GET /v1/libraries)"})] = None
    candidates: Annotated[list[Text] | None, _documented({
        "anyOf": [{"type": "array", "minItems": 1, "maxItems": MAX_CANDIDATES,
                   "items": {"type": "string", "minLength": 1, "maxLength": MAX_CANDIDATE_CHARS,
                             "pattern": CANDIDATE_PATTERN}},
                  {"type": "null"}],
        "description": "explicit rationale texts instead of a library"})] = None
    mode: Literal["ssr", "freeform"] = "ssr"
    tau: float = Field(DEFAULT_TAU, ge=0.0, le=MAX_TAU)
    alpha: float = Field(DEFAULT_ALPHA, ge=0.0, le=MAX_ALPHA)
    reasoning_budget: int = Field(DEFAULT_REASONING_TOKENS, ge=1, le=MAX_REASONING_TOKENS)


class ResponseFormat(_Loose):
    type: Annotated[str, _documented({"type": "string", "const": "text", "default": "text"})] = "text"


class ChatCompletionRequest(_Loose):
    model: str = Field(..., description="the served model's id (GET /v1/models)")
    messages: Annotated[list[ChatMessage], Field(min_length=1), _SystemFirst()]
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    seed: int | None = None  # any integer, as OpenAI accepts (folded onto 64 bits)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, _documented({"type": "integer", "const": 1, "default": 1,
                                   "description": "one completion per request"})] = Field(1, ge=1)
    logprobs: Annotated[bool | None, _documented({"anyOf": [{"type": "boolean", "const": False},
                                                             {"type": "null"}],
                                                   "description": "not supported"})] = None
    response_format: ResponseFormat | None = None
    ssr: SSRExtension | None = None


def describe_server(doc: dict[str, Any], model: str, libraries: Iterable[str]) -> dict[str, Any]:
    """``doc`` (the app's OpenAPI document), its chat-completions request narrowed to one server: the
    model it serves and the libraries it has, the values a generator cannot guess."""
    schemas = doc["components"]["schemas"]
    schemas["ChatCompletionRequest"]["properties"]["model"]["enum"] = [model]
    library = schemas["SSRExtension"]["properties"]["library"]
    next(b for b in library["anyOf"] if b.get("type") == "string")["enum"] = sorted(libraries)
    return doc

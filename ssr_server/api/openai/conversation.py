"""A chat-completions request as the completer takes it: the client's tools, the tool choice and the
messages, checked against the limits before admission (``conversation``) and turned into chat messages
once the images are in (``messages``).

The checks stay in this order, so a request with several faults is refused for the same one as ever.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ssr_server.agent.chat import Message, PendingMessage, Role, ToolCallRecord
from ssr_server.agent.completion import ClientTool, ReasoningMemory, ToolChoice
from ssr_server.api import request_limits as limits
from ssr_server.api.openai.protocol import (
    AssistantMessage,
    ChatCompletionRequest,
    ChatMessage,
    ImagePart,
    ToolMessage,
)
from ssr_server.core.config import Settings
from ssr_server.core.errors import InvalidRequest, PayloadTooLarge
from ssr_server.core.protocol import ImageRef

MAX_TOOLS = 64
MAX_SCHEMA_CHARS = 16_000
# OpenAI's "developer" message is the system message of its newer models.
_ROLES: dict[str, Role] = {"system": "system", "developer": "system", "user": "user",
                           "assistant": "assistant", "tool": "tool"}


def refuse_unsupported(body: ChatCompletionRequest) -> None:
    if body.n != 1:
        raise InvalidRequest("n must be 1: one completion per request")
    if body.logprobs:
        raise InvalidRequest("logprobs are not supported")
    if body.response_format is not None and body.response_format.type != "text":
        raise InvalidRequest(f"response_format {body.response_format.type!r} is not supported")


def client_tools(body: ChatCompletionRequest) -> list[ClientTool]:
    tools = [ClientTool(t.function.name, t.function.description, t.function.parameters)
             for t in body.tools or ()]
    if len(tools) > MAX_TOOLS:
        raise PayloadTooLarge(f"{len(tools)} tools; the limit is {MAX_TOOLS}")
    if len({t.name for t in tools}) != len(tools):
        raise InvalidRequest("tool names must be unique")
    for t in tools:
        if len(json.dumps(t.parameters)) > MAX_SCHEMA_CHARS:
            raise PayloadTooLarge(f"the parameters of tool {t.name!r} exceed {MAX_SCHEMA_CHARS} characters")
        if t.parameters.get("type", "object") != "object":
            raise InvalidRequest(f"the parameters of tool {t.name!r} must be a JSON schema of type object")
    return tools


def tool_choice(body: ChatCompletionRequest) -> ToolChoice:
    tc = body.tool_choice
    if tc is None:
        return ToolChoice("auto" if body.tools else "none")
    if isinstance(tc, str):
        if tc == "required" and not body.tools:
            raise InvalidRequest("tool_choice 'required' needs tools")
        return ToolChoice(tc)
    return ToolChoice("function", tc.function.name)


@dataclass(frozen=True)
class Conversation:
    """The request's messages, checked; their images not fetched yet."""

    requested: tuple[ChatMessage, ...]  # as sent: assistant turns keep their tool calls until rendered
    pending: tuple[PendingMessage, ...]  # the same messages, roles mapped, images as indexes
    image_specs: tuple[str, ...]


def conversation(s: Settings, body: ChatCompletionRequest) -> Conversation:
    """Raises what would refuse the messages: their order, a tool message without its call, the limits."""
    specs: list[str] = []
    pending: list[PendingMessage] = []
    texts: list[str] = []
    for i, m in enumerate(body.messages):
        if m.role in ("system", "developer") and i != 0:
            raise InvalidRequest("a system (or developer) message may only come first")
        if isinstance(m, ToolMessage) and not m.tool_call_id:
            raise InvalidRequest(f"messages[{i}]: a tool message needs tool_call_id")
        message = PendingMessage(_ROLES[m.role], _pieces(m, specs))
        texts += message.texts()
        if isinstance(m, AssistantMessage):
            texts += [c.function.arguments for c in m.tool_calls or ()]
        pending.append(message)
    limits.check_messages(s, len(body.messages))
    limits.check_images(s, len(specs))
    limits.check_conversation(s, sum(len(t) for t in texts))
    if body.ssr is not None:
        limits.check_candidates(s, body.ssr.candidates, "ssr.candidates")
    return Conversation(tuple(body.messages), tuple(pending), tuple(specs))


def _pieces(m: ChatMessage, specs: list[str]) -> tuple[str | int, ...]:
    """The message's text pieces and image indexes into ``specs`` (collected; fetched later)."""
    if m.content is None:
        return ()
    if isinstance(m.content, str):
        return (m.content,)
    out: list[str | int] = []
    for p in m.content:
        if isinstance(p, ImagePart):
            if m.role != "user":
                raise InvalidRequest(f"image parts are only allowed in user messages, not {m.role!r}")
            out.append(len(specs))
            specs.append(p.image_url.url)
        else:
            out.append(p.text)
    return tuple(out)


def messages(conv: Conversation, images: Sequence[ImageRef], memory: ReasoningMemory) -> list[Message]:
    """The chat messages, images in. An assistant turn's tool calls are parsed here, after admission as
    ever; its reasoning, which OpenAI clients drop, comes back from ``memory`` by call id."""
    return [_message(m, p.with_images(images), memory) for m, p in zip(conv.requested, conv.pending,
                                                                        strict=True)]


def _message(m: ChatMessage, message: Message, memory: ReasoningMemory) -> Message:
    if not isinstance(m, AssistantMessage):
        return message
    calls = []
    reasoning = m.reasoning_content
    for c in m.tool_calls or ():
        try:
            arguments = json.loads(c.function.arguments or "{}")
        except ValueError:
            raise InvalidRequest(f"the arguments of tool call {c.id!r} are not valid JSON") from None
        if not isinstance(arguments, dict):
            raise InvalidRequest(f"the arguments of tool call {c.id!r} are not a JSON object")
        calls.append(ToolCallRecord(c.function.name, arguments))
        reasoning = reasoning or memory.recall(c.id)
    return replace(message, reasoning=reasoning, tool_calls=tuple(calls))

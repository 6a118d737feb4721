"""OpenAI-compatible routes: ``POST /v1/chat/completions`` (with tools, streaming) and ``GET /v1/models``.

One request is one assistant turn (``agent.completion``): the reasoning is selected by SSR and returned
as ``reasoning_content`` (the field SGLang and vLLM use), the action as ``tool_calls`` or ``content``.
Images arrive as ``image_url`` parts through the same safe intake as the agent endpoint; the request
takes an admission slot like every model route, and errors leave in OpenAI's shape (``api.errors``).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from ssr_server import metrics
from ssr_server.agent.chat import Message, ToolCallRecord
from ssr_server.agent.completion import (
    ClientTool,
    Completer,
    Completion,
    CompletionOptions,
    ReasoningCallback,
    ReasoningMemory,
    ToolChoice,
)
from ssr_server.api.admission import acquire_or_disconnect
from ssr_server.api.errors import error_payload, openai_error
from ssr_server.api.images import load_image
from ssr_server.api.openai_schemas import ChatCompletionRequest, ChatMessage, ImagePart
from ssr_server.api.state import AppState
from ssr_server.engine.base import ImageRef
from ssr_server.errors import InvalidRequest, PayloadTooLarge, ShuttingDown, UnknownModel
from ssr_server.library import Library

router = APIRouter(tags=["openai"])
MAX_TOOLS = 64
MAX_SCHEMA_CHARS = 16_000


def _state(request: Request) -> AppState:
    state: AppState = request.app.state.ssr
    return state


def model_name(st: AppState) -> str:
    return st.settings.served_model_name or st.settings.model or "ssr-tiny"


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    st = _state(request)
    return {"object": "list", "data": [{"id": model_name(st), "object": "model", "created": st.started,
                                        "owned_by": "ssr-server"}]}


# ---- request -> conversation ---------------------------------------------------------------------
def _tools(body: ChatCompletionRequest) -> list[ClientTool]:
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


def _tool_choice(body: ChatCompletionRequest) -> ToolChoice:
    tc = body.tool_choice
    if tc is None:
        return ToolChoice("auto" if body.tools else "none")
    if isinstance(tc, str):
        if tc == "required" and not body.tools:
            raise InvalidRequest("tool_choice 'required' needs tools")
        return ToolChoice(tc)
    return ToolChoice("function", tc.function.name)


def _unsupported(body: ChatCompletionRequest) -> None:
    if body.n != 1:
        raise InvalidRequest("n must be 1: one completion per request")
    if body.logprobs:
        raise InvalidRequest("logprobs are not supported")
    if body.response_format is not None and body.response_format.type != "text":
        raise InvalidRequest(f"response_format {body.response_format.type!r} is not supported")


def _pieces(m: ChatMessage, specs: list[str]) -> list[str | int]:
    """The message's text pieces and image indexes into ``specs`` (collected; fetched later)."""
    if m.content is None:
        return []
    if isinstance(m.content, str):
        return [m.content]
    out: list[str | int] = []
    for p in m.content:
        if isinstance(p, ImagePart):
            if m.role != "user":
                raise InvalidRequest(f"image parts are only allowed in user messages, not {m.role!r}")
            out.append(len(specs))
            specs.append(p.image_url.url)
        else:
            out.append(p.text)
    return out


def _check(st: AppState, body: ChatCompletionRequest, specs: Sequence[str], texts: Sequence[str]) -> None:
    s = st.settings
    if len(body.messages) > s.max_messages:
        raise PayloadTooLarge(f"{len(body.messages)} messages; the limit is {s.max_messages}")
    if len(specs) > s.max_images:
        raise PayloadTooLarge(f"{len(specs)} images; the limit is {s.max_images}")
    chars = sum(len(t) for t in texts)
    if chars > s.max_conversation_chars:
        raise PayloadTooLarge(
            f"the messages hold {chars} characters; the limit is {s.max_conversation_chars}")
    ssr = body.ssr
    if ssr is not None and ssr.candidates is not None:
        if not 1 <= len(ssr.candidates) <= s.max_candidates:
            raise InvalidRequest(f"ssr.candidates must hold 1..{s.max_candidates} texts")
        if any(len(c) > s.max_candidate_chars for c in ssr.candidates):
            raise PayloadTooLarge(f"a candidate is longer than {s.max_candidate_chars} characters")


_Parsed = list[tuple[ChatMessage, list[str | int]]]


def _conversation(st: AppState, body: ChatCompletionRequest) -> tuple[_Parsed, list[str]]:
    specs: list[str] = []
    parsed = []
    texts: list[str] = []
    for i, m in enumerate(body.messages):
        if m.role in ("system", "developer") and i != 0:
            raise InvalidRequest("a system (or developer) message may only come first")
        if m.role == "tool" and not m.tool_call_id:
            raise InvalidRequest(f"messages[{i}]: a tool message needs tool_call_id")
        pieces = _pieces(m, specs)
        texts += [p for p in pieces if isinstance(p, str)]
        texts += [c.function.arguments for c in m.tool_calls or ()]
        parsed.append((m, pieces))
    _check(st, body, specs, texts)
    return parsed, specs


def _message(m: ChatMessage, pieces: list[str | int], images: Sequence[ImageRef],
             memory: ReasoningMemory) -> Message:
    content = tuple(images[p] if isinstance(p, int) else p for p in pieces)
    role = "system" if m.role == "developer" else m.role
    if role != "assistant":
        return Message(role, content)  # type: ignore[arg-type]
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
    return Message("assistant", content, reasoning=reasoning, tool_calls=tuple(calls))


# ---- the route -----------------------------------------------------------------------------------
@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    st = _state(request)
    if body.model != model_name(st):
        raise UnknownModel(
            f"model {body.model!r} is not served here; GET /v1/models lists {model_name(st)!r}")
    _unsupported(body)
    tools = _tools(body)
    choice = _tool_choice(body)
    ssr = body.ssr
    library = _library(st, ssr, tools)
    memory: ReasoningMemory = st.reasoning_memory
    parsed, specs = _conversation(st, body)
    temperature = body.temperature if body.temperature is not None else 0.0
    seed = None if body.seed is None else body.seed % 2**64
    options = CompletionOptions(
        mode=ssr.mode if ssr else "ssr", tau=ssr.tau if ssr else 0.0, alpha=ssr.alpha if ssr else 1.0,
        temperature=temperature, seed=seed, max_tokens=body.max_completion_tokens or body.max_tokens,
        reasoning_budget=ssr.reasoning_budget if ssr else 256)
    completer: Completer = st.completer
    include_usage = body.stream and bool(body.stream_options and body.stream_options.include_usage)
    reply = _Reply(model_name(st), include_usage)
    # Admission before any image is fetched or decoded; images before the first byte of a stream, so
    # that a refused request or a bad image is an HTTP status, not an error chunk.
    ticket = await acquire_or_disconnect(st.admission, request)
    if ticket is None:  # the client left while queued
        return Response(status_code=499)
    images = await ticket.guard(asyncio.gather(
        *(load_image(s, st.image_limits, st.http) for s in specs)))
    try:
        messages = [_message(m, pieces, images, memory) for m, pieces in parsed]
        ctx = completer.render(messages, tools, library)
    except BaseException:
        ticket.release()
        raise

    async def run(on_reasoning: ReasoningCallback | None = None) -> Completion:
        async with asyncio.timeout(st.settings.run_deadline_s):
            done = await completer.complete(ctx, library, tools, choice, options, on_reasoning)
        if done.tool_name is not None:
            memory.remember(reply.call_id, done.reasoning)
        return done

    def start(on_reasoning: ReasoningCallback | None = None) -> asyncio.Task[Completion]:
        task = asyncio.create_task(run(on_reasoning))
        ticket.bind(task)  # cancelled at the shutdown drain's deadline
        task.add_done_callback(ticket.release)
        return task

    if body.stream:
        return StreamingResponse(_stream(start, reply), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    task = start()
    while True:
        finished, _ = await asyncio.wait({task}, timeout=0.25)
        if finished:
            if task.cancelled():  # by the shutdown drain's deadline
                raise ShuttingDown("the server shut down before the completion finished")
            return JSONResponse(reply.whole(task.result()))  # errors go to the error handlers
        if await request.is_disconnected():
            task.cancel()
            metrics.REQUESTS_REJECTED.labels(reason="client_disconnected").inc()
            return Response(status_code=499)


def _library(st: AppState, ssr: Any, tools: Sequence[ClientTool]) -> Library:
    if ssr is not None and ssr.candidates:
        return Library.from_texts(list(ssr.candidates))
    if ssr is not None and ssr.library:
        return st.libraries.get(ssr.library)
    completer: Completer = st.completer
    # Our own tools (or none): the default library's moves map onto them. Any other tool set: a
    # library whose candidates allow any tool.
    name = st.settings.default_library if completer.is_native(tools) else st.settings.generic_library
    return st.libraries.get(name)


class _Reply:
    """The response objects: one whole ``chat.completion``, or its ``chat.completion.chunk`` stream."""

    def __init__(self, model: str, include_usage: bool) -> None:
        self.id = "chatcmpl-" + uuid.uuid4().hex
        self.call_id = "call_" + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.model = model
        self.include_usage = include_usage

    def _usage(self, c: Completion) -> dict[str, Any]:
        return {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
                "total_tokens": c.prompt_tokens + c.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": c.cached_tokens},
                "completion_tokens_details": {"reasoning_tokens": c.reasoning_tokens}}

    def _ssr(self, c: Completion) -> dict[str, Any]:
        t = c.turn
        return {"candidate_id": c.candidate_id, "scores": t.scores, "q": t.q,
                "reasoning_s": t.reasoning_s, "action_s": t.action_s, "error": t.error}

    def _calls(self, c: Completion) -> list[dict[str, Any]]:
        return [{"id": self.call_id, "type": "function",
                 "function": {"name": c.tool_name, "arguments": c.arguments or ""}}]

    def whole(self, c: Completion) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": c.content,
                                   "reasoning_content": c.reasoning}
        if c.tool_name is not None:
            message["tool_calls"] = self._calls(c)
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "message": message, "finish_reason": c.finish_reason,
                             "logprobs": None}],
                "usage": self._usage(c), "ssr": self._ssr(c)}

    def chunk(self, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        body: dict[str, Any] = {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                                "model": self.model,
                                "choices": [{"index": 0, "delta": delta, "finish_reason": finish,
                                             "logprobs": None}]}
        if self.include_usage:
            body["usage"] = None
        body.update(extra)
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    def final(self, c: Completion) -> list[str]:
        if c.tool_name is None:
            out = [self.chunk({"content": c.content or ""})]
        else:
            call = self._calls(c)[0]
            out = [self.chunk({"tool_calls": [{"index": 0, "id": call["id"], "type": "function",
                                               "function": {"name": c.tool_name, "arguments": ""}}]}),
                   self.chunk({"tool_calls": [{"index": 0, "function": {"arguments": c.arguments or ""}}]})]
        out.append(self.chunk({}, c.finish_reason, ssr=self._ssr(c)))
        if self.include_usage:
            body = {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                    "model": self.model, "choices": [], "usage": self._usage(c)}
            out.append(f"data: {json.dumps(body)}\n\n")
        return out


async def _stream(start: Callable[[ReasoningCallback], asyncio.Task[Completion]],
                  reply: _Reply) -> AsyncIterator[str]:
    """Role first, the selected reasoning as soon as it is chosen (before the action is decoded), then
    the action, the finish reason, optional usage and ``[DONE]``. An error after the first byte is
    sent as an ``error`` chunk (what the openai client raises on); a client gone cancels the work."""
    queue: asyncio.Queue[str] = asyncio.Queue()

    async def on_reasoning(text: str) -> None:
        queue.put_nowait(reply.chunk({"reasoning_content": text}))

    task = start(on_reasoning)
    try:
        yield reply.chunk({"role": "assistant", "content": ""})
        while True:
            getter = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if getter in done:
                yield getter.result()
                continue
            getter.cancel()
            while not queue.empty():
                yield queue.get_nowait()
            break
        exc = (ShuttingDown("the server shut down before the completion finished")
               if task.cancelled() else task.exception())
        if exc is None:
            for line in reply.final(task.result()):
                yield line
        else:
            status, payload = error_payload(exc)
            yield f"data: {json.dumps({'error': openai_error(status, payload)})}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        if not task.done():
            task.cancel()
            metrics.REQUESTS_REJECTED.labels(reason="client_disconnected").inc()


__all__ = ["router"]

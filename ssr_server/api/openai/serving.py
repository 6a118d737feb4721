"""The OpenAI-compatible API's work: one request is one assistant turn (``agent.completion``), answered
whole or streamed.

Like the REST routes, a request is served in two halves around the router's admission slot: ``prepare``
refuses what it can without I/O; ``complete`` fetches the images before the first byte of a stream, so
that a bad image is an HTTP status rather than an error chunk, and runs the turn in its own task.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from ssr_server.agent.completion import (
    ClientTool,
    Completer,
    Completion,
    CompletionOptions,
    ReasoningCallback,
    ToolChoice,
)
from ssr_server.api.admission import Ticket
from ssr_server.api.openai import conversation as conv
from ssr_server.api.openai.protocol import ChatCompletionRequest, SSRExtension
from ssr_server.api.openai.reply import DONE, Reply
from ssr_server.api.state import AppState
from ssr_server.api.tasks import client_closed, drop_unfinished, failure, relay, result_or_disconnect
from ssr_server.core.errors import UnknownModel
from ssr_server.core.library import Library

COMPLETION_CUT = "the server shut down before the completion finished"
# Proxies (nginx) buffer a response unless told not to: a stream must arrive as it is written.
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def model_name(st: AppState) -> str:
    return st.settings.served_model_name or st.settings.model or "ssr-tiny"


def models(st: AppState) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": model_name(st), "object": "model", "created": st.started,
                                        "owned_by": "ssr-server"}]}


@dataclass(frozen=True)
class Prepared:
    """A request checked and parsed, its images not fetched yet."""

    tools: list[ClientTool]
    choice: ToolChoice
    library: Library
    conversation: conv.Conversation
    options: CompletionOptions
    stream: bool
    reply: Reply


def prepare(st: AppState, body: ChatCompletionRequest) -> Prepared:
    """Raises what would refuse the request: another model, an unsupported field, bad tools, an unknown
    library, a malformed conversation or one over the limits."""
    if body.model != model_name(st):
        raise UnknownModel(
            f"model {body.model!r} is not served here; GET /v1/models lists {model_name(st)!r}")
    conv.refuse_unsupported(body)
    tools = conv.client_tools(body)
    choice = conv.tool_choice(body)
    ssr = body.ssr or SSRExtension()  # its defaults are the completion's
    library = _library(st, ssr, tools)
    conversation = conv.conversation(st.settings, body)
    options = CompletionOptions(
        mode=ssr.mode, tau=ssr.tau, alpha=ssr.alpha,
        temperature=body.temperature if body.temperature is not None else 0.0,
        seed=None if body.seed is None else body.seed % 2**64,
        max_tokens=body.max_completion_tokens or body.max_tokens, reasoning_budget=ssr.reasoning_budget)
    include_usage = body.stream and bool(body.stream_options and body.stream_options.include_usage)
    return Prepared(tools, choice, library, conversation, options, body.stream,
                    Reply(model_name(st), include_usage))


def _library(st: AppState, ssr: SSRExtension, tools: Sequence[ClientTool]) -> Library:
    if ssr.candidates:
        return Library.from_texts(list(ssr.candidates))
    if ssr.library:
        return st.libraries.get(ssr.library)
    completer: Completer = st.completer
    # Our own tools (or none): the default library's moves map onto them. Any other tool set: a
    # library whose candidates allow any tool.
    name = st.settings.default_library if completer.is_native(tools) else st.settings.generic_library
    return st.libraries.get(name)


async def complete(st: AppState, req: Prepared, ticket: Ticket, request: Request) -> Response:
    """The admitted turn, in its own task (see ``api.tasks``) that the ticket's slot follows to its end."""
    completer: Completer = st.completer
    memory = st.reasoning_memory
    reply = req.reply
    images = await ticket.guard(st.load_images(req.conversation.image_specs))
    try:
        ctx = completer.render(conv.messages(req.conversation, images, memory), req.tools, req.library)
    except BaseException:
        ticket.release()
        raise

    async def turn(on_reasoning: ReasoningCallback | None = None) -> Completion:
        # The completer keeps the deadline itself, so that a completion past it is a 504 counted as a
        # ``timeout`` run, not a bare cancellation that would leave as a 500.
        done = await completer.complete(ctx, req.library, req.tools, req.choice, req.options, on_reasoning,
                                        deadline_s=st.settings.run_deadline_s)
        if done.tool_name is not None:
            memory.remember(reply.call_id, done.reasoning)
        return done

    def start(on_reasoning: ReasoningCallback | None = None) -> asyncio.Task[Completion]:
        task = asyncio.create_task(turn(on_reasoning))
        ticket.bind(task)  # cancelled at the shutdown drain's deadline
        task.add_done_callback(ticket.release)
        return task

    if req.stream:
        return StreamingResponse(_stream(start, reply), media_type="text/event-stream",
                                 headers=STREAM_HEADERS)
    done = await result_or_disconnect(start(), request, COMPLETION_CUT)
    return client_closed() if done is None else JSONResponse(reply.whole(done))


async def _stream(start: Callable[[ReasoningCallback], asyncio.Task[Completion]],
                  reply: Reply) -> AsyncIterator[str]:
    """Role first, the selected reasoning as soon as it is chosen (before the action is decoded), then
    the action, the finish reason, optional usage and ``[DONE]``. An error after the first byte is
    sent as an ``error`` chunk (what the openai client raises on); a client gone cancels the work."""
    queue: asyncio.Queue[str] = asyncio.Queue()

    async def on_reasoning(text: str) -> None:
        queue.put_nowait(reply.chunk({"reasoning_content": text}))

    task = start(on_reasoning)
    try:
        yield reply.chunk({"role": "assistant", "content": ""})
        async with aclosing(relay(task, queue)) as chunks:
            async for chunk in chunks:
                yield chunk
        exc = failure(task, COMPLETION_CUT)
        if exc is None:
            for line in reply.final(task.result()):
                yield line
        else:
            yield reply.error(exc)
        yield DONE
    finally:
        drop_unfinished(task)

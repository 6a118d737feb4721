"""The REST agent API's work: a run (answered whole, or streamed as server-sent events), one selection
step on a client's conversation, and the libraries.

Each request is served in two halves around the router's admission slot: ``run_options`` and
``prepare_selection`` refuse what they can without I/O (limits, options, an unknown library), so that a
refused request costs no slot; only the second half fetches images and asks the engine.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

from fastapi import Request, Response
from sse_starlette.sse import EventSourceResponse

from ssr_server.agent.chat import PendingMessage
from ssr_server.agent.loop import RunOptions
from ssr_server.agent.step import select_step
from ssr_server.agent.trace import Run, Turn
from ssr_server.api import request_limits as limits
from ssr_server.api.admission import Ticket
from ssr_server.api.errors import error_payload
from ssr_server.api.rest.protocol import (
    LibraryOut,
    RunRequest,
    RunResponse,
    SelectRequest,
    SelectResponse,
    Timings,
    TurnOut,
    Usage,
)
from ssr_server.api.runs import serving as runs
from ssr_server.api.state import AppState
from ssr_server.api.tasks import client_closed, drop_unfinished, failure, relay, result_or_disconnect
from ssr_server.core.errors import InvalidRequest
from ssr_server.core.library import Library
from ssr_server.core.limits import DEFAULT_MAX_TURNS

RUN_CUT = "the server shut down before the run finished; retry on another replica"
SSE_PING_S = 15  # keeps proxies from closing a stream while a long turn runs


def libraries(st: AppState) -> list[LibraryOut]:
    libs = st.libraries
    return [LibraryOut(name=lib.name, description=lib.description,
                       candidates=[{"id": c.id, "text": c.text, "action": c.action} for c in lib.candidates])
            for lib in (libs.get(n) for n in libs.names())]


# ---- a run ----------------------------------------------------------------------------------------
def run_options(st: AppState, body: RunRequest) -> RunOptions:
    """The run as the agent takes it; raises what would refuse it (limits, options, unknown library)."""
    s = st.settings
    max_turns = body.max_turns
    if max_turns is None:
        max_turns = min(DEFAULT_MAX_TURNS, s.max_turns)
    limits.check_question(s, body.question)
    limits.check_images(s, len(body.images))
    limits.check_candidates(s, body.candidates)
    limits.check_turns(s, max_turns)
    options = RunOptions(
        mode=body.mode, library=body.library or s.default_library,
        candidates=tuple(body.candidates or ()), tau=body.tau, alpha=body.alpha, max_turns=max_turns,
        seed=body.seed, label_only=body.label_only, reasoning_budget=body.reasoning_budget,
        action_temperature=body.action_temperature, tool_timeout_s=s.tool_timeout_s)
    options.validate()
    if body.background and body.stream:
        raise InvalidRequest("a background run is not streamed: follow GET /v1/agent/runs/{id}/events")
    runs.check(st, body.store, body.background)
    library = st.agent.library_for(options)  # unknown library -> 404 before any work
    if options.mode == "ssr":  # a library none of whose moves can run without an image -> 400
        st.agent.check_can_act(library, len(body.images))
    return options


async def run(st: AppState, body: RunRequest, options: RunOptions, ticket: Ticket,
              request: Request) -> RunResponse | Response:
    """The admitted run, in its own task (see ``api.tasks``) that the ticket's slot follows to its end."""
    images = await ticket.guard(st.load_images(body.images))  # a bad image frees the slot
    queue: asyncio.Queue[Turn] = asyncio.Queue()

    async def on_turn(turn: Turn) -> None:
        queue.put_nowait(turn)

    listener = on_turn if body.stream else None
    # A stored run is written as it goes (api.runs.serving.recorded); a store that fails to take its
    # first write leaves the run unstored, unless it is a background run (503, the slot freed).
    rec = runs.new_run(st, body.question, options, body.background) if runs.check(
        st, body.store, body.background) else None
    if rec is not None and not await ticket.guard(runs.open_record(st, rec)):
        rec = None
    task = asyncio.create_task(
        st.agent.run(body.question, images, options, on_turn=listener, deadline_s=st.settings.run_deadline_s)
        if rec is None else runs.recorded(st, rec, images, options, listener, st.settings.run_deadline_s))
    ticket.bind(task)  # cancelled at the shutdown drain's deadline
    task.add_done_callback(ticket.release)
    task.add_done_callback(lambda t: st.stats.add_run(t.result()) if _succeeded(t) else None)
    if rec is not None and rec.background:
        return runs.accepted(rec)
    if body.stream:
        return EventSourceResponse(_events(task, queue), ping=SSE_PING_S,
                                   shutdown_grace_period=st.settings.drain_timeout_s)
    done = await result_or_disconnect(task, request, RUN_CUT)
    return client_closed() if done is None else run_response(done)


def _succeeded(task: asyncio.Task[Run]) -> bool:
    return not task.cancelled() and task.exception() is None


async def _events(task: asyncio.Task[Run], queue: asyncio.Queue[Turn]) -> AsyncIterator[dict[str, str]]:
    """One ``turn`` event per turn as it ends, then ``run`` (the whole run) or ``error``: a client sees
    progress at once and still gets one final object, the same as the plain response."""
    try:
        async with aclosing(relay(task, queue)) as turns:
            async for turn in turns:
                yield {"event": "turn", "data": turn_out(turn).model_dump_json()}
        exc = failure(task, RUN_CUT)
        if exc is None:
            yield {"event": "run", "data": run_response(task.result()).model_dump_json()}
        else:
            status, payload = error_payload(exc)
            yield {"event": "error", "data": json.dumps({"status": status, "error": payload})}
    finally:
        drop_unfinished(task)


def turn_out(t: Turn) -> TurnOut:
    return TurnOut(**t.to_dict())


def run_response(run: Run) -> RunResponse:
    return RunResponse(
        id=run.id, question=run.question, mode=run.mode, library=run.library, outcome=run.outcome,
        answer=run.answer, error=run.error, turns=[turn_out(t) for t in run.turns],
        timings=Timings(total_s=run.total_s, model_s=run.model_s, tool_s=run.tool_s),
        usage=Usage(prompt_tokens=run.prompt_tokens, scored_tokens=run.scored_tokens,
                    generated_tokens=run.generated_tokens),
    )


# ---- one selection step ------------------------------------------------------------------------
@dataclass(frozen=True)
class Selection:
    """A selection request, checked and parsed; its images not fetched yet."""

    library: Library
    messages: tuple[PendingMessage, ...]
    image_specs: tuple[str, ...]  # what each PendingMessage image index names


def prepare_selection(st: AppState, body: SelectRequest) -> Selection:
    """Raises what would refuse the step (limits, an unknown library, an image part without an image)."""
    s = st.settings
    limits.check_messages(s, len(body.messages))
    library = (Library.from_texts(body.candidates) if body.candidates
               else st.libraries.get(body.library or s.default_library))
    messages: list[PendingMessage] = []
    specs: list[str] = []
    for m in body.messages:
        pieces: list[str | int] = []
        for p in ([m.content] if isinstance(m.content, str) else m.content):
            if isinstance(p, str):
                pieces.append(p)
            elif p.type == "image":
                if not p.image:
                    raise InvalidRequest("an image part needs 'image' (base64, data URL or http(s) URL)")
                pieces.append(len(specs))
                specs.append(p.image)
            else:
                pieces.append(p.text or "")
        messages.append(PendingMessage(m.role, tuple(pieces)))
    # The conversation's text counts against the question limit: it plays the question's part.
    limits.check_question(s, "\n".join(t for m in messages for t in m.texts()))
    limits.check_images(s, len(specs))
    limits.check_candidates(s, body.candidates)
    return Selection(library, tuple(messages), tuple(specs))


async def select(st: AppState, body: SelectRequest, selection: Selection) -> SelectResponse:
    """The step, under the caller's admission slot."""
    images = await st.load_images(selection.image_specs)
    ctx = st.agent.chat.render([m.with_images(images) for m in selection.messages], selection.library)
    library = selection.library
    step = await select_step(st.engine, ctx, library, st.agent.candidate_ids(library, body.label_only),
                             alpha=body.alpha, tau=body.tau, seed=body.seed)
    cand = step.candidate
    return SelectResponse(
        index=step.selection.index, candidate_id=cand.id, text=cand.text, action=cand.action,
        scores=list(step.selection.scores), q=list(step.selection.q),
        logprob_sums=[s.logprob_sum for s in step.scores], token_counts=[s.num_tokens for s in step.scores],
        context_tokens=len(ctx), latency_s=step.latency_s)

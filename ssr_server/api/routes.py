"""HTTP routes: the agent endpoint (plain and SSE), one selection step, libraries, health, metrics."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sse_starlette.sse import EventSourceResponse

from ssr_server import metrics
from ssr_server.agent.chat import Message
from ssr_server.agent.loop import RunOptions
from ssr_server.agent.step import select_step
from ssr_server.agent.trace import Run, Turn
from ssr_server.api.admission import acquire_or_disconnect
from ssr_server.api.errors import error_payload
from ssr_server.api.images import load_image
from ssr_server.api.schemas import (
    LibraryOut,
    RunRequest,
    RunResponse,
    SelectRequest,
    SelectResponse,
    Timings,
    TurnOut,
    Usage,
)
from ssr_server.api.state import AppState
from ssr_server.engine.base import Context, ImageRef
from ssr_server.errors import InvalidRequest, PayloadTooLarge, ShuttingDown
from ssr_server.library import Library

router = APIRouter()
_ERRORS: dict[int | str, dict[str, Any]] = {
    s: {"description": d} for s, d in {
        400: "bad input", 401: "missing or wrong API key", 404: "unknown library", 413: "too large",
        422: "validation error", 429: "overloaded (Retry-After)", 503: "engine unavailable or shutting down",
    }.items()
}


def _state(request: Request) -> AppState:
    state: AppState = request.app.state.ssr
    return state


# ---- probes and metrics -------------------------------------------------------------------------
@router.get("/health", tags=["ops"])
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/ready", tags=["ops"], responses={503: {"description": "engine not ready"}})
async def ready(request: Request) -> Response:
    st = _state(request)
    try:
        async with asyncio.timeout(5.0):
            ok = await st.engine.ready()
    except Exception:
        ok = False
    ok = ok and not st.admission.draining
    metrics.ENGINE_READY.set(1 if ok else 0)
    body = {"ready": ok, "engine": st.engine.name, "draining": st.admission.draining,
            "runs_in_flight": st.admission.running, "runs_queued": st.admission.queued}
    return Response(json.dumps(body), status_code=200 if ok else 503, media_type="application/json")


@router.get("/metrics", tags=["ops"])
async def prometheus_metrics() -> Response:
    return Response(generate_latest(metrics.REGISTRY), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/stats", tags=["ops"])
async def stats(request: Request) -> dict[str, Any]:
    return _state(request).stats.snapshot()


@router.get("/v1/libraries", tags=["agent"])
async def libraries(request: Request) -> list[LibraryOut]:
    libs = _state(request).libraries
    return [LibraryOut(name=lib.name, description=lib.description,
                       candidates=[{"id": c.id, "text": c.text, "action": c.action} for c in lib.candidates])
            for lib in (libs.get(n) for n in libs.names())]


# ---- the agent ------------------------------------------------------------------------------------
def _check_limits(st: AppState, question: str, images: Sequence[str], candidates: Sequence[str] | None,
                  max_turns: int = 1) -> None:
    s = st.settings
    if len(question) > s.max_question_chars:
        raise PayloadTooLarge(f"question is {len(question)} characters; the limit is {s.max_question_chars}")
    if len(images) > s.max_images:
        raise PayloadTooLarge(f"{len(images)} images; the limit is {s.max_images}")
    if candidates is not None:
        if not 1 <= len(candidates) <= s.max_candidates:
            raise InvalidRequest(f"candidates must hold 1..{s.max_candidates} texts")
        if any(len(c) > s.max_candidate_chars for c in candidates):
            raise PayloadTooLarge(f"a candidate is longer than {s.max_candidate_chars} characters")
    if max_turns > s.max_turns:
        raise InvalidRequest(f"max_turns is {max_turns}; this server allows at most {s.max_turns}")


async def _images(st: AppState, specs: Sequence[str]) -> list[ImageRef]:
    return list(await asyncio.gather(*(load_image(s, st.image_limits, st.http) for s in specs)))


def _turn_out(t: Turn) -> TurnOut:
    return TurnOut(**t.to_dict())


def _response(run: Run) -> RunResponse:
    return RunResponse(
        id=run.id, question=run.question, mode=run.mode, library=run.library, outcome=run.outcome,
        answer=run.answer, error=run.error, turns=[_turn_out(t) for t in run.turns],
        timings=Timings(total_s=run.total_s, model_s=run.model_s, tool_s=run.tool_s),
        usage=Usage(prompt_tokens=run.prompt_tokens, scored_tokens=run.scored_tokens,
                    generated_tokens=run.generated_tokens),
    )


@router.post("/v1/agent/runs", tags=["agent"], response_model=RunResponse, responses=_ERRORS)
async def create_run(body: RunRequest, request: Request) -> Any:
    st = _state(request)
    max_turns = body.max_turns if body.max_turns is not None else min(6, st.settings.max_turns)
    _check_limits(st, body.question, body.images, body.candidates, max_turns)
    options = RunOptions(
        mode=body.mode, library=body.library or st.settings.default_library,
        candidates=tuple(body.candidates or ()), tau=body.tau, alpha=body.alpha, max_turns=max_turns,
        seed=body.seed, label_only=body.label_only, reasoning_budget=body.reasoning_budget,
        action_temperature=body.action_temperature,
        tool_timeout_s=st.settings.tool_timeout_s)
    options.validate()
    st.agent.library_for(options)  # unknown library -> 404 before any work
    # Admission before any image is fetched or decoded: a refused request (429) costs no image work.
    ticket = await acquire_or_disconnect(st.admission, request)
    if ticket is None:  # the client left while queued
        return Response(status_code=499)
    images = await ticket.guard(_images(st, body.images))  # a bad image frees the slot
    queue: asyncio.Queue[Turn] = asyncio.Queue()

    async def on_turn(turn: Turn) -> None:
        queue.put_nowait(turn)

    task = asyncio.create_task(st.agent.run(
        body.question, images, options, on_turn=on_turn if body.stream else None,
        deadline_s=st.settings.run_deadline_s))
    ticket.bind(task)  # cancelled at the shutdown drain's deadline
    task.add_done_callback(ticket.release)
    task.add_done_callback(lambda t: st.stats.add_run(t.result()) if _ok(t) else None)
    if body.stream:
        return EventSourceResponse(_events(task, queue), ping=15,
                                   shutdown_grace_period=st.settings.drain_timeout_s)
    return await _until_done_or_disconnect(task, request)


def _ok(task: asyncio.Task[Run]) -> bool:
    return not task.cancelled() and task.exception() is None


async def _until_done_or_disconnect(task: asyncio.Task[Run], request: Request) -> Any:
    """Wait for the run; a client that goes away cancels it (its engine work is dropped)."""
    while True:
        done, _ = await asyncio.wait({task}, timeout=0.25)
        if done:
            if task.cancelled():  # by the shutdown drain's deadline (a client gone is handled below)
                raise ShuttingDown("the server shut down before the run finished; retry on another replica")
            return _response(task.result())  # engine errors propagate to the error handlers
        if await request.is_disconnected():
            task.cancel()
            metrics.REQUESTS_REJECTED.labels(reason="client_disconnected").inc()
            return Response(status_code=499)


async def _events(task: asyncio.Task[Run], queue: asyncio.Queue[Turn]) -> AsyncIterator[dict[str, str]]:
    """One ``turn`` event per turn, then ``run`` (the whole run) or ``error``. Disconnect cancels."""
    try:
        while True:
            getter = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if getter in done:
                yield {"event": "turn", "data": _turn_out(getter.result()).model_dump_json()}
                continue
            getter.cancel()
            while not queue.empty():
                yield {"event": "turn", "data": _turn_out(queue.get_nowait()).model_dump_json()}
            break
        exc = (ShuttingDown("the server shut down before the run finished; retry on another replica")
               if task.cancelled() else task.exception())  # cancelled: by the shutdown drain's deadline
        if exc is None:
            yield {"event": "run", "data": _response(task.result()).model_dump_json()}
        else:
            status, payload = error_payload(exc)
            yield {"event": "error", "data": json.dumps({"status": status, "error": payload})}
    finally:
        if not task.done():  # the stream was dropped before the run ended
            task.cancel()
            metrics.REQUESTS_REJECTED.labels(reason="client_disconnected").inc()


# ---- one selection step ------------------------------------------------------------------------
_Pieces = list[tuple[str, list[str | int]]]  # (role, [text | index into the image specs])


def _parse_messages(st: AppState, body: SelectRequest) -> tuple[_Pieces, list[str]]:
    """The messages as roles and pieces, and the image specs they name; limits checked (no I/O yet)."""
    parsed: _Pieces = []
    specs: list[str] = []
    texts: list[str] = []
    for m in body.messages:
        pieces: list[str | int] = []
        for p in ([m.content] if isinstance(m.content, str) else m.content):
            if isinstance(p, str):
                pieces.append(p)
                texts.append(p)
            elif p.type == "image":
                if not p.image:
                    raise InvalidRequest("an image part needs 'image' (base64, data URL or http(s) URL)")
                pieces.append(len(specs))
                specs.append(p.image)
            else:
                pieces.append(p.text or "")
                texts.append(p.text or "")
        parsed.append((m.role, pieces))
    _check_limits(st, "\n".join(texts), specs, body.candidates)
    return parsed, specs


async def _render_messages(st: AppState, parsed: _Pieces, specs: Sequence[str], library: Library) -> Context:
    images = await _images(st, specs)
    messages = [Message(role, tuple(images[p] if isinstance(p, int) else p for p in pieces))  # type: ignore[arg-type]
                for role, pieces in parsed]
    return st.agent.chat.render(messages, library)


@router.post("/v1/ssr/select", tags=["agent"], response_model=SelectResponse, responses=_ERRORS)
async def select_route(body: SelectRequest, request: Request) -> SelectResponse:
    """One selection step on a conversation (the format's system prompt for the library comes first
    when the messages hold no system message)."""
    st = _state(request)
    if len(body.messages) > st.settings.max_messages:
        raise PayloadTooLarge(f"{len(body.messages)} messages; the limit is {st.settings.max_messages}")
    library = (Library.from_texts(body.candidates) if body.candidates
               else st.libraries.get(body.library or st.settings.default_library))
    parsed, specs = _parse_messages(st, body)
    async with st.admission.slot():  # 429 before any image is fetched or decoded
        ctx = await _render_messages(st, parsed, specs, library)
        step = await select_step(st.engine, ctx, library, st.agent.candidate_ids(library, body.label_only),
                                 alpha=body.alpha, tau=body.tau, seed=body.seed)
    cand = step.candidate
    return SelectResponse(
        index=step.selection.index, candidate_id=cand.id, text=cand.text, action=cand.action,
        scores=list(step.selection.scores), q=list(step.selection.q),
        logprob_sums=[s.logprob_sum for s in step.scores], token_counts=[s.num_tokens for s in step.scores],
        context_tokens=len(ctx), latency_s=step.latency_s)


__all__ = ["router"]

"""The stored runs' work: recording a run as it goes (its start, every turn, its end), background runs,
and what the routes read, cancel and delete.

A stored run's task is ``recorded``: the agent's run with an ``on_turn`` that writes each finished turn
as it ends, beside the run (in order; the next turn does not wait for the database), so that a crash
loses at most the turn in flight and a write still under way. The task is bound to the
request's admission ticket like any run (``api.rest.serving.run``): a background run holds its slot until
it ends, and the shutdown drain waits for it, then cancels it at its deadline (it is then
``interrupted``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from fastapi.responses import JSONResponse

from ssr_server.agent.loop import RunOptions
from ssr_server.agent.trace import Run, Turn
from ssr_server.api.runs.protocol import RunAccepted, RunPage, StoredRunOut, stored_out, summary_out
from ssr_server.api.state import AppState
from ssr_server.core.errors import InvalidRequest, public_message
from ssr_server.core.protocol import ImageRef
from ssr_server.store.base import RunStore
from ssr_server.store.images import encode, zoom_crop, zoom_of
from ssr_server.store.records import (
    ACTIVE,
    INTERRUPTED,
    ImageBlob,
    NewRun,
    RunConflict,
    RunFilter,
    RunNotFound,
    Status,
    StoreOff,
    StoreUnavailable,
    status_of,
)

log = logging.getLogger(__name__)
TurnCallback = Callable[[Turn], Awaitable[None]]
CANCELLED = "cancelled through the API"
CLIENT_GONE = "the client went away before the run finished"
EVENTS_POLL_S = 0.3  # how often a live event stream looks for new turns in the store
CANCEL_WAIT_S = 10.0  # a cancelled run's last write, before the cancel is answered


def require_store(st: AppState) -> RunStore:
    if st.store is None:
        raise StoreOff("runs are not kept on this server (SSR_RUN_STORE=off)")
    return st.store


def check(st: AppState, store: bool, background: bool) -> bool:
    """Whether the run is to be stored; refuses (400) a background run that could not be."""
    if background and not (store and st.store is not None):
        why = "store is false" if st.store is not None else "this server keeps no runs (SSR_RUN_STORE=off)"
        raise InvalidRequest(f"a background run must be stored, and {why}")
    return store and st.store is not None


def new_run(st: AppState, question: str, options: RunOptions, background: bool) -> NewRun:
    opts = {"mode": options.mode, "library": options.library, "candidates": list(options.candidates),
            "tau": options.tau, "alpha": options.alpha, "max_turns": options.max_turns, "seed": options.seed,
            "label_only": options.label_only, "reasoning_budget": options.reasoning_budget,
            "action_temperature": options.action_temperature}
    return NewRun(id=uuid.uuid4().hex, question=question, mode=options.mode,
                  library=st.agent.library_for(options).name, options=opts, background=background)


async def open_record(st: AppState, rec: NewRun) -> bool:
    """The run's first write (queued for a background run, else running). A background run cannot go
    on without it (``StoreUnavailable``); any other run goes on unstored (False)."""
    store = require_store(st)
    try:
        await store.create(rec, "queued" if rec.background else "running")
        return True
    except Exception as exc:
        log.warning("run store: could not record run %s: %s", rec.id, public_message(str(exc)))
        if rec.background:
            raise StoreUnavailable("the run store cannot take the run now; retry later") from None
        return False


async def recorded(st: AppState, rec: NewRun, images: Sequence[ImageRef], options: RunOptions,
                   on_turn: TurnCallback | None, deadline_s: float | None) -> Run:
    """The run, written to the store as it goes (the task of a stored run)."""
    store = require_store(st)
    me = asyncio.current_task()
    if me is not None:
        st.in_flight[rec.id] = me  # type: ignore[assignment]
    limit = st.settings.run_store_max_image_bytes
    saving = asyncio.create_task(_save_inputs(store, rec.id, images, limit))
    done: list[Turn] = []
    # Each turn's write goes beside the run, in order (each waits for the one before): the next turn does
    # not wait for the database, and the run's end waits for them all before its own write.
    writes: list[asyncio.Task[None]] = []

    async def write_turn(turn: dict[str, object], tool_ok: bool, before: asyncio.Task[None] | None) -> None:
        if before is not None:
            await asyncio.wait({before})
        await _safely(store.add_turn(rec.id, turn), rec.id)
        zoom = zoom_of(turn.get("tool_data")) if tool_ok else None  # type: ignore[arg-type]
        if zoom is not None:
            await _save_zoom(store, rec.id, await asyncio.shield(saving), zoom, limit)

    async def write(turn: Turn) -> None:
        done.append(turn)
        writes.append(asyncio.create_task(write_turn(turn.to_dict(), turn.observation_ok,
                                                     writes[-1] if writes else None)))
        if on_turn is not None:
            await on_turn(turn)

    async def written() -> None:
        if writes:
            await asyncio.wait(writes)

    try:
        if rec.background:
            await _safely(store.set_status(rec.id, "running"), rec.id)
        run = await st.agent.run(rec.question, images, options, on_turn=write, run_id=rec.id,
                                 deadline_s=deadline_s)
    except asyncio.CancelledError:
        asked = rec.id in st.cancel_asked
        status: Status = "cancelled" if asked or not st.admission.expired else "interrupted"
        error = CANCELLED if asked else INTERRUPTED if status == "interrupted" else CLIENT_GONE
        await written()
        await _finish(store, rec.id, status, _partial(rec, done, error))
        if not asked:
            raise
        if me is not None:
            me.uncancel()  # cancelled on purpose: the run ends here, with what it did so far
        return _partial(rec, done, error)
    except Exception as exc:
        await written()
        await _finish(store, rec.id, "failed", _partial(rec, done, public_message(str(exc))))
        raise
    else:
        await written()
        await _finish(store, rec.id, status_of(run.outcome), run)
        return run
    finally:
        st.in_flight.pop(rec.id, None)
        st.cancel_asked.discard(rec.id)
        if not saving.done():
            await asyncio.wait({saving})


def accepted(rec: NewRun) -> JSONResponse:
    """202 for a background run: where to fetch it."""
    url = f"/v1/agent/runs/{rec.id}"
    body = RunAccepted(id=rec.id, status="queued", url=url)
    return JSONResponse(body.model_dump(), status_code=202, headers={"Location": url})


def _partial(rec: NewRun, turns: list[Turn], error: str) -> Run:
    run = Run(id=rec.id, question=rec.question, mode=rec.mode, library=rec.library, outcome="cancelled",
              error=error, turns=list(turns))
    run.model_s = sum(t.reasoning_s + t.action_s for t in turns)
    run.tool_s = sum(t.tool_s for t in turns)
    run.total_s = sum(t.turn_s for t in turns)
    return run


async def _finish(store: RunStore, run_id: str, status: Status, run: Run) -> None:
    outcome = None if status in ("interrupted", "failed") and run.outcome == "cancelled" else run.outcome
    if status == "failed":
        outcome = "error"
    await _safely(store.finish(
        run_id, status, outcome=outcome, answer=run.answer, error=run.error,
        timings={"total_s": run.total_s, "model_s": run.model_s, "tool_s": run.tool_s},
        usage={"prompt_tokens": run.prompt_tokens, "scored_tokens": run.scored_tokens,
               "generated_tokens": run.generated_tokens}), run_id)


async def _safely(write: Awaitable[None], run_id: str) -> None:
    """A failed write is logged, and the run goes on: the store records runs, it does not run them."""
    try:
        await write
    except Exception as exc:
        log.warning("run store: a write of run %s failed: %s", run_id, public_message(str(exc)))


async def _save_inputs(store: RunStore, run_id: str, images: Sequence[ImageRef],
                       limit: int) -> dict[int, ImageBlob]:
    """The run's images as the model saw them; off the run's path (encoding takes a few ms each)."""
    blobs = {n: await asyncio.to_thread(encode, ref.image, limit) for n, ref in enumerate(images)}
    await _safely(store.add_images(run_id, list(blobs.items())), run_id)
    return blobs


async def _save_zoom(store: RunStore, run_id: str, blobs: dict[int, ImageBlob],
                     zoom: tuple[int, int, tuple[int, int, int, int]], limit: int) -> None:
    new, src, box = zoom
    parent = blobs.get(src)
    if parent is None:  # cut from an image the store does not keep (a search thumbnail)
        return
    crop = await asyncio.to_thread(zoom_crop, parent, src, box, limit)
    blobs[new] = crop
    await _safely(store.add_images(run_id, [(new, crop)]), run_id)


# ---- reading, cancelling, deleting ----------------------------------------------------------------
async def get(st: AppState, run_id: str) -> StoredRunOut:
    found = await require_store(st).get(run_id)
    if found is None:
        raise RunNotFound(f"no stored run {run_id!r}")
    return stored_out(found)


async def page(st: AppState, where: RunFilter, limit: int, after: str | None) -> RunPage:
    found = await require_store(st).list(where, limit, after)
    data = [summary_out(s) for s in found.runs]
    return RunPage(data=data, has_more=found.has_more,
                   next_after=data[-1].id if found.has_more and data else None)


async def cancel(st: AppState, run_id: str) -> StoredRunOut:
    store = require_store(st)
    task = st.in_flight.get(run_id)
    if task is not None and not task.done():
        st.cancel_asked.add(run_id)
        task.cancel()
        await asyncio.wait({task}, timeout=CANCEL_WAIT_S)
        return await get(st, run_id)
    summary = await store.summary(run_id)
    if summary is None:
        raise RunNotFound(f"no stored run {run_id!r}")
    if summary.status in ACTIVE:
        raise RunConflict(f"run {run_id} is in flight on another server: cancel it there")
    raise RunConflict(f"run {run_id} has already ended ({summary.status})")


async def delete(st: AppState, run_id: str) -> None:
    store = require_store(st)
    summary = await store.summary(run_id)
    if summary is None:
        raise RunNotFound(f"no stored run {run_id!r}")
    if summary.status in ACTIVE:
        raise RunConflict(f"run {run_id} is {summary.status}: cancel it first")
    await store.delete(run_id)


async def image(st: AppState, run_id: str, n: int) -> ImageBlob:
    blob = await require_store(st).image(run_id, n)
    if blob is None:
        raise RunNotFound(f"run {run_id!r} has no stored image {n}")
    return blob


async def events(st: AppState, run_id: str) -> AsyncIterator[dict[str, str]]:
    """``turn`` events (the turns so far, then each new one), ``status`` at each change, and a final
    ``run`` (the whole stored run) once it has ended. Read from the store, so a run on another replica
    streams the same; a stream still open when this server drains ends with an ``error`` event."""
    store = require_store(st)
    sent, last = 0, None
    while True:
        summary = await store.summary(run_id)
        if summary is None:
            yield {"event": "error", "data": json.dumps({"status": 404, "error": {
                "code": RunNotFound.code, "message": f"run {run_id} was deleted"}})}
            return
        for turn in await store.turns(run_id, sent):  # read after the status: complete once it ended
            yield {"event": "turn", "data": json.dumps(turn)}
            sent += 1
        if summary.status != last:
            last = summary.status
            yield {"event": "status", "data": summary_out(summary).model_dump_json()}
        if summary.status not in ACTIVE:
            yield {"event": "run", "data": (await get(st, run_id)).model_dump_json()}
            return
        if st.admission.draining:
            yield {"event": "error", "data": json.dumps({"status": 503, "error": {
                "code": "shutting_down", "message": "the server is shutting down; reconnect elsewhere"}})}
            return
        await asyncio.sleep(EVENTS_POLL_S)


"""The stored runs' path operations and the run viewer (``/ui``, static files in the package). Their
names are the OpenAPI operation ids."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.staticfiles import StaticFiles
from sse_starlette.sse import EventSourceResponse

from ssr_server.api.runs import serving
from ssr_server.api.runs.protocol import RunPage, RunStatus, StoredRunOut
from ssr_server.api.state import app_state
from ssr_server.store.records import RunFilter

router = APIRouter()
VIEWER = Path(__file__).resolve().parent / "ui"
SSE_PING_S = 15
_ERRORS: dict[int | str, dict[str, Any]] = {
    s: {"description": d} for s, d in {
        400: "bad input (an unknown cursor)", 401: "missing or wrong API key",
        404: "no such run or image, or the run store is off", 409: "the run's state forbids it",
        422: "validation error",
    }.items()
}
RunId = Annotated[str, PathParam(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]


@router.get("/v1/agent/runs", tags=["runs"], responses=_ERRORS)
async def list_runs(
    request: Request,
    status: Annotated[RunStatus | None, Query()] = None,
    mode: Annotated[str | None, Query(max_length=16)] = None,
    outcome: Annotated[str | None, Query(max_length=32)] = None,
    since: Annotated[datetime | None, Query(description="ISO 8601 or unix seconds")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: Annotated[str | None, Query(max_length=64, description="the previous page's next_after")] = None,
) -> RunPage:
    """Stored runs, newest first, a page at a time."""
    where = RunFilter(status=status, mode=mode, outcome=outcome,
                      since=None if since is None else since.timestamp())
    return await serving.page(app_state(request), where, limit, after)


@router.get("/v1/agent/runs/{run_id}", tags=["runs"], responses=_ERRORS)
async def get_run(run_id: RunId, request: Request) -> StoredRunOut:
    """A stored run: its status and every turn so far (a run in flight included)."""
    return await serving.get(app_state(request), run_id)


@router.get("/v1/agent/runs/{run_id}/events", tags=["runs"], responses=_ERRORS,
            response_class=EventSourceResponse)
async def run_events(run_id: RunId, request: Request) -> EventSourceResponse:
    """Server-sent events: the turns so far, then each new one as it ends; ``status`` at each change; a
    final ``run`` event (the whole stored run) once it has ended."""
    st = app_state(request)
    await serving.get(st, run_id)  # 404 before the stream starts
    return EventSourceResponse(serving.events(st, run_id), ping=SSE_PING_S,
                               shutdown_grace_period=st.settings.drain_timeout_s)


@router.post("/v1/agent/runs/{run_id}/cancel", tags=["runs"], responses=_ERRORS)
async def cancel_run(run_id: RunId, request: Request) -> StoredRunOut:
    """Cancel a run in flight on this server; it ends ``cancelled`` with the turns it finished."""
    return await serving.cancel(app_state(request), run_id)


@router.delete("/v1/agent/runs/{run_id}", tags=["runs"], status_code=204, responses=_ERRORS)
async def delete_run(run_id: RunId, request: Request) -> Response:
    """Delete a stored run that has ended (its turns and images with it)."""
    await serving.delete(app_state(request), run_id)
    return Response(status_code=204)


@router.get("/v1/agent/runs/{run_id}/images/{n}", tags=["runs"], response_class=Response,
            responses={**_ERRORS, 200: {"content": {"image/png": {}, "image/jpeg": {}},
                                        "description": "the image's bytes"}})
async def run_image(run_id: RunId, n: Annotated[int, PathParam(ge=0, le=10_000)],
                    request: Request) -> Response:
    """Image ``n`` of a run (0-based, numbered as the model saw them: the inputs, then zoom crops)."""
    blob = await serving.image(app_state(request), run_id, n)
    # A stored image never changes: the browser may keep it.
    return Response(blob.data, media_type=blob.media_type,
                    headers={"Cache-Control": "private, max-age=86400, immutable"})


def mount_viewer(app: FastAPI) -> None:
    """The run viewer at ``/ui/`` (files shipped in the package: it works offline)."""
    app.mount("/ui", StaticFiles(directory=VIEWER, html=True), name="ui")


__all__ = ["mount_viewer", "router"]

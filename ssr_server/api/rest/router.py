"""The REST agent API's path operations: parse (FastAPI), admission, serving, answer. Their names are the
OpenAPI operation ids and ``select_route``'s docstring is its published description: renaming either
changes the schema clients generate from."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from ssr_server.api.admission import acquire_or_disconnect
from ssr_server.api.rest import serving
from ssr_server.api.rest.protocol import LibraryOut, RunRequest, RunResponse, SelectRequest, SelectResponse
from ssr_server.api.state import app_state
from ssr_server.api.tasks import client_closed

router = APIRouter()
_ERRORS: dict[int | str, dict[str, Any]] = {
    s: {"description": d} for s, d in {
        400: "bad input", 401: "missing or wrong API key", 404: "unknown library", 413: "too large",
        422: "validation error", 429: "overloaded (Retry-After)", 503: "engine unavailable or shutting down",
    }.items()
}


@router.get("/v1/libraries", tags=["agent"])
async def libraries(request: Request) -> list[LibraryOut]:
    return serving.libraries(app_state(request))


@router.post("/v1/agent/runs", tags=["agent"], response_model=RunResponse, responses=_ERRORS)
async def create_run(body: RunRequest, request: Request) -> Any:
    st = app_state(request)
    options = serving.run_options(st, body)
    # Admission before any image is fetched or decoded: a refused request (429) costs no image work.
    ticket = await acquire_or_disconnect(st.admission, request)
    if ticket is None:  # the client left while queued
        return client_closed()
    return await serving.run(st, body, options, ticket, request)


@router.post("/v1/ssr/select", tags=["agent"], response_model=SelectResponse, responses=_ERRORS)
async def select_route(body: SelectRequest, request: Request) -> SelectResponse:
    """One selection step on a conversation (the format's system prompt for the library comes first
    when the messages hold no system message)."""
    st = app_state(request)
    selection = serving.prepare_selection(st, body)
    async with st.admission.slot():  # 429 before any image is fetched or decoded
        return await serving.select(st, body, selection)


__all__ = ["router"]

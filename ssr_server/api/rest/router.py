"""The REST agent API's path operations: parse (FastAPI), admission, serving, answer. Their names are the
OpenAPI operation ids and ``select_route``'s docstring is its published description: renaming either
changes the schema clients generate from."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from ssr_server.api.gate import admitted, admitted_slot
from ssr_server.api.rest import serving
from ssr_server.api.rest.protocol import LibraryOut, RunRequest, RunResponse, SelectRequest, SelectResponse
from ssr_server.api.state import app_state

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
    # The slot was taken from the headers (api.gate.AdmissionGate), before the body was read: a
    # refused request (429) cost no body parsing and no image work; a 4xx above gives it back there.
    return await serving.run(st, body, options, admitted(request.scope), request)


@router.post("/v1/ssr/select", tags=["agent"], response_model=SelectResponse, responses=_ERRORS)
async def select_route(body: SelectRequest, request: Request) -> SelectResponse:
    """One selection step on a conversation (the format's system prompt for the library comes first
    when the messages hold no system message)."""
    st = app_state(request)
    selection = serving.prepare_selection(st, body)
    async with admitted_slot(request.scope):  # taken from the headers, before the body
        return await serving.select(st, body, selection)


__all__ = ["router"]

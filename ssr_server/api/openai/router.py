"""The OpenAI-compatible path operations: parse (FastAPI), admission, serving, answer. Their names are
the OpenAPI operation ids; errors on these paths leave in OpenAI's shape (``api.errors``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from ssr_server.api.gate import admitted
from ssr_server.api.openai import serving
from ssr_server.api.openai.protocol import ChatCompletionRequest
from ssr_server.api.state import app_state

router = APIRouter(tags=["openai"])


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    return serving.models(app_state(request))


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    st = app_state(request)
    prepared = serving.prepare(st, body)
    # The slot was taken from the headers (api.gate.AdmissionGate), before the body was read: a
    # refused request cost no body parsing and no image work; an error above gives it back there.
    return await serving.complete(st, prepared, admitted(request.scope), request)


__all__ = ["router"]

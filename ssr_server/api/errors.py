"""Every error leaves the server in one JSON shape: ``{"error": {"code", "message", "details"}}``; on
the OpenAI-compatible routes in OpenAI's (``{"error": {"message", "type", "param", "code"}}``, and a
request that fails validation is a 400 there, as OpenAI answers it).

Typed errors (``SSRError`` subclasses) carry their own status; validation errors become 422 (400 for
a body that is not JSON at all: broken syntax, invalid UTF-8, nesting too deep to parse); anything
unexpected becomes a logged 500 with no internals leaked. Messages never carry object reprs or memory
addresses (``<_io.BytesIO object at 0x...>``), whatever library text they quote.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ssr_server.core import metrics
from ssr_server.core.errors import Overloaded, ShuttingDown, SSRError, public_message

log = logging.getLogger(__name__)

SHUTDOWN_RETRY_AFTER_S = 1  # another replica can take the request at once


OPENAI_PATHS = ("/v1/chat/completions", "/v1/models")


def is_openai(path: str) -> bool:
    return path.startswith(OPENAI_PATHS)


def openai_error(status: int, payload: dict[str, Any]) -> dict[str, Any]:
    """Our error body (``code``, ``message``) in OpenAI's shape."""
    kind = ("invalid_request_error" if status < 429 or 429 < status < 500
            else "rate_limit_error" if status == 429 else "server_error")
    return {"message": payload["message"], "type": kind, "param": payload.get("param"),
            "code": payload["code"]}


def error_response(status: int, code: str, message: str, details: Any = None,
                   headers: dict[str, str] | None = None, path: str = "") -> JSONResponse:
    body: dict[str, Any] = {"code": code, "message": public_message(message)}
    if details is not None:
        body["details"] = details
    if is_openai(path):
        body = openai_error(status, body)
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def error_payload(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """Status and body for an exception (also used for the final event of a stream)."""
    if isinstance(exc, SSRError):
        return exc.status_code, {"code": exc.code, "message": public_message(exc.message)}
    return 500, {"code": "internal_error", "message": "internal server error"}


def retry_headers(exc: SSRError) -> dict[str, str] | None:
    if isinstance(exc, Overloaded):
        return {"Retry-After": str(max(1, round(exc.retry_after_s)))}
    if isinstance(exc, ShuttingDown):
        return {"Retry-After": str(SHUTDOWN_RETRY_AFTER_S)}
    return None


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(SSRError)
    async def _ssr(request: Request, exc: SSRError) -> JSONResponse:
        if isinstance(exc, Overloaded):
            metrics.REQUESTS_REJECTED.labels(reason="overloaded").inc()
        elif exc.status_code >= 500 and not isinstance(exc, ShuttingDown):
            log.warning("%s: %s", exc.code, exc.message)
        return error_response(exc.status_code, exc.code, exc.message, headers=retry_headers(exc),
                              path=request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        path = request.url.path
        if any(e.get("type") == "json_invalid" for e in errors):
            return error_response(400, "invalid_json", "request body is not valid JSON", path=path)
        details = [{"loc": list(e.get("loc", ())), "msg": public_message(str(e.get("msg", ""))),
                    "type": e.get("type", "")} for e in errors]
        first = details[0] if details else {"loc": [], "msg": "invalid request"}
        where = ".".join(str(x) for x in first["loc"] if x != "body") or "body"
        status = 400 if is_openai(path) else 422
        return error_response(status, "validation_error", f"{where}: {first['msg']}", details, path=path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # FastAPI turns every failure to parse a JSON body other than a syntax error into a bare 400:
        # invalid UTF-8 (UnicodeDecodeError), nesting deeper than the parser's recursion limit, and an
        # integer longer than Python converts (ValueError; its limit is the interpreter's, not ours).
        cause = exc.__cause__
        if exc.status_code == 400 and isinstance(cause, ValueError | RecursionError):
            why = ("nested too deeply" if isinstance(cause, RecursionError)
                   else "not valid UTF-8" if isinstance(cause, UnicodeError)
                   else "it holds a number too long to read" if "integer string conversion" in str(cause)
                   else "it cannot be parsed")
            return error_response(400, "invalid_json", f"request body is not valid JSON ({why})",
                                  path=request.url.path)
        codes = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized"}
        return error_response(exc.status_code, codes.get(exc.status_code, "http_error"), str(exc.detail),
                              headers=getattr(exc, "headers", None), path=request.url.path)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return error_response(500, "internal_error", "internal server error", path=request.url.path)

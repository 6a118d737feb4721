"""Every error leaves the server in one JSON shape: ``{"error": {"code", "message", "details"}}``.

Typed errors (``SSRError`` subclasses) carry their own status; validation errors become 422 (400 for
a body that is not JSON at all); anything unexpected becomes a logged 500 with no internals leaked.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ssr_server import metrics
from ssr_server.errors import Overloaded, SSRError

log = logging.getLogger(__name__)


def error_response(status: int, code: str, message: str, details: Any = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    body: dict[str, Any] = {"code": code, "message": message}
    if details is not None:
        body["details"] = details
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def error_payload(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """Status and body for an exception (also used for the final event of a stream)."""
    if isinstance(exc, SSRError):
        return exc.status_code, {"code": exc.code, "message": exc.message}
    return 500, {"code": "internal_error", "message": "internal server error"}


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(SSRError)
    async def _ssr(_: Request, exc: SSRError) -> JSONResponse:
        headers = None
        if isinstance(exc, Overloaded):
            headers = {"Retry-After": str(max(1, round(exc.retry_after_s)))}
            metrics.REQUESTS_REJECTED.labels(reason="overloaded").inc()
        elif exc.status_code >= 500:
            log.warning("%s: %s", exc.code, exc.message)
        return error_response(exc.status_code, exc.code, exc.message, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return error_response(400, "invalid_json", "request body is not valid JSON")
        details = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
                   for e in errors]
        first = details[0] if details else {"loc": [], "msg": "invalid request"}
        where = ".".join(str(x) for x in first["loc"] if x != "body") or "body"
        return error_response(422, "validation_error", f"{where}: {first['msg']}", details)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized"}
        return error_response(exc.status_code, codes.get(exc.status_code, "http_error"), str(exc.detail),
                              headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return error_response(500, "internal_error", "internal server error")

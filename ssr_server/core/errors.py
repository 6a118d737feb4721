"""One exception tree for the whole package.

Every error a caller can cause or see derives from ``SSRError``; the HTTP layer maps each class to a
status code in one place (``ssr_server.api.errors``). Library text quoted in a message passes through
``public_message`` first. Code never ``assert``s on user input.
"""

from __future__ import annotations

import re

_REPR = re.compile(r"\s*<[^<>]*\bat 0x[0-9a-fA-F]+>")
_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]{8,}\b")
# A library's own bookkeeping in its messages: a log timestamp ("[21:35:40] "), a source location
# ("/project/cpp/json_schema_converter.cc:5082: ", "(_ssl.c:1006)").
_TIMESTAMP = re.compile(r"\[\d{1,2}:\d{2}:\d{2}(?:\.\d+)?\]\s*")
_SOURCE = re.compile(r"\(?(?:[\w.+-]*/)*[\w.+-]+\.(?:cc|cpp|cxx|c|h|hpp|py|pyx|rs|go):\d+\)?:?\s*")


def public_message(text: str) -> str:
    """``text`` without object reprs, memory addresses, timestamps or source locations (library
    messages quote their objects and their own files); the messages we write never need them."""
    text = _SOURCE.sub("", _TIMESTAMP.sub("", _REPR.sub("", text)))
    return _ADDRESS.sub("0x...", text).strip()


class SSRError(Exception):
    """Base of every error raised on purpose by ssr-server."""

    status_code = 500
    code = "internal_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRequest(SSRError):
    """The request is well-formed JSON but asks for something impossible or out of range."""

    status_code = 400
    code = "invalid_request"


class InvalidImage(InvalidRequest):
    """An image could not be decoded, is too large, or has a format we do not accept."""

    code = "invalid_image"


class PayloadTooLarge(InvalidRequest):
    status_code = 413
    code = "payload_too_large"


class UnknownLibrary(InvalidRequest):
    status_code = 404
    code = "unknown_library"


class UnknownModel(InvalidRequest):
    code = "model_not_found"
    status_code = 404


class LibraryError(SSRError):
    """A rationale library file is invalid (raised at load time, names the file and entry)."""

    code = "library_error"


class Overloaded(SSRError):
    """Admission control refused the run: too many runs in flight and the queue is full."""

    status_code = 429
    code = "overloaded"

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class EngineError(SSRError):
    """The model engine failed while serving a request."""

    status_code = 500
    code = "engine_error"


class EngineUnavailable(EngineError):
    """The engine cannot be reached or is not ready (e.g. SGLang down); retrying later may succeed."""

    status_code = 503
    code = "engine_unavailable"


class ContextTooLong(InvalidRequest):
    code = "context_too_long"


class ToolError(SSRError):
    """A tool failed; the agent loop turns this into an observation, never into an HTTP error."""

    code = "tool_error"


class ActionParseError(SSRError):
    """The model's action could not be parsed; becomes an observation and counts toward the error limit."""

    code = "action_parse_error"


class ShuttingDown(SSRError):
    status_code = 503
    code = "shutting_down"

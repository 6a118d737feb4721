"""The server's logs: plain text (the default) or one JSON object a line (``SSR_LOG_FORMAT=json``).

Two lines are the server's own record of its work: one per finished run (logger ``ssr_server.runs``:
run id, mode, outcome, turns, latencies) and, in JSON, one per request (``ssr_server.requests``: method,
path, status, duration; written by ``RequestLog``, which stands in for uvicorn's access line). A JSON line
carries ``trace_id`` and ``span_id`` of the span it was written in when tracing is on, so a log line, a
trace and an exemplar name the same request.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from datetime import UTC, datetime
from typing import Any, Literal

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ssr_server.core import tracing

LogFormat = Literal["text", "json"]
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

RUNS = logging.getLogger("ssr_server.runs")
REQUESTS = logging.getLogger("ssr_server.requests")


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, the record's ``fields``, the span's ids."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        ids = tracing.current_ids()
        if ids is not None:
            out["trace_id"], out["span_id"] = ids
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def setup(fmt: LogFormat, level: str = "info") -> None:
    """The root logger's one handler on stderr, in ``fmt``. In JSON, uvicorn's own loggers write
    through it too (``RequestLog`` replaces its access line, so that one is silenced)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    if fmt == "json":
        for name in ("uvicorn", "uvicorn.error"):
            logging.getLogger(name).handlers.clear()
            logging.getLogger(name).propagate = True
        logging.getLogger("uvicorn.access").disabled = True
        logging.captureWarnings(True)  # warnings.warn output becomes JSON lines too
        _no_progress_bars()


def _no_progress_bars() -> None:
    """Model loading draws tqdm bars on stderr, which a JSON log reader cannot parse: off in JSON. The
    hub reads its variable when imported; a library imported already is told directly."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "huggingface_hub" in sys.modules:
        from huggingface_hub import disable_progress_bars

        disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def run_finished(run_id: str | None, mode: str, outcome: str, turns: int, total_s: float, model_s: float,
                 error: str | None = None) -> None:
    """The finished run's line (a chat completion is a run of one turn)."""
    if not RUNS.isEnabledFor(logging.INFO):
        return
    fields = {"event": "run", "run_id": run_id, "mode": mode, "outcome": outcome, "turns": turns,
              "total_s": round(total_s, 6), "model_s": round(model_s, 6), "error": error}
    RUNS.info("run %s %s %s turns=%d total=%.3fs model=%.3fs", run_id or "-", mode, outcome, turns,
              total_s, model_s, extra={"fields": fields})


class RequestLog:
    """One line per HTTP request once its answer has gone out: method, path, status, seconds. Placed
    inside the tracing middleware, so the line carries the request's trace id."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 0

        async def record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, record)
        finally:
            seconds = time.perf_counter() - t0
            fields = {"event": "request", "method": scope["method"], "path": scope["path"],
                      "status": status or None, "duration_s": round(seconds, 6)}
            REQUESTS.info("%s %s %s %.3fs", scope["method"], scope["path"], status or "-", seconds,
                          extra={"fields": fields})

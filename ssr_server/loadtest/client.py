"""One request of a load, plain or streamed (SSE), turned into its record; never raises but cancellation."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import httpx

from ssr_server.loadtest.records import RequestRecord
from ssr_server.loadtest.workload import PlannedRequest

REFUSED_STATUSES = frozenset({429, 503})


def _retry_after(headers: httpx.Headers) -> float | None:
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None  # an HTTP date: not worth parsing here


def _fill_from_run(rec: RequestRecord, run: Mapping[str, Any]) -> None:
    rec.outcome = run.get("outcome")
    turns = run.get("turns") or []
    rec.turns = len(turns)
    rec.reasoning_s = [float(t.get("reasoning_s", 0.0)) for t in turns]
    timings = run.get("timings") or {}
    rec.model_s = timings.get("model_s")
    rec.tool_s = timings.get("tool_s")
    rec.server_total_s = timings.get("total_s")


def _error_text(resp_text: str, status: int) -> str:
    try:
        err = json.loads(resp_text).get("error", {})
        return f"{status} {err.get('code', '')}: {err.get('message', '')}".strip()
    except (ValueError, AttributeError):
        return f"{status}: {resp_text[:200]}"


async def _send_plain(client: httpx.AsyncClient, url: str, req: PlannedRequest, rec: RequestRecord) -> None:
    resp = await client.post(url, json=req.body)
    rec.status = resp.status_code
    if resp.status_code == 200:
        _fill_from_run(rec, resp.json())
        rec.fate = "completed"
    else:
        _classify_error(rec, resp.status_code, resp.headers, resp.text)


def _classify_error(rec: RequestRecord, status: int, headers: httpx.Headers, text: str) -> None:
    rec.error = _error_text(text, status)
    if status in REFUSED_STATUSES:
        rec.fate = "refused"
        rec.retry_after_s = _retry_after(headers)
    else:
        rec.fate = "failed"


async def _send_stream(client: httpx.AsyncClient, url: str, req: PlannedRequest, rec: RequestRecord,
                       t0: float) -> None:
    body = dict(req.body, stream=True)
    async with client.stream("POST", url, json=body) as resp:
        rec.status = resp.status_code
        if resp.status_code != 200:
            text = (await resp.aread()).decode("utf-8", "replace")
            _classify_error(rec, resp.status_code, resp.headers, text)
            return
        event, data = "message", []
        async for line in resp.aiter_lines():
            if line.startswith(":"):
                continue  # keep-alive comment
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip())
            elif line == "" and data:
                payload = "\n".join(data)
                if event == "turn" and rec.first_turn_s is None:
                    rec.first_turn_s = time.perf_counter() - t0
                elif event == "run":
                    _fill_from_run(rec, json.loads(payload))
                    rec.fate = "completed"
                elif event == "error":
                    err = json.loads(payload)
                    status = int(err.get("status", 500))
                    rec.status = status
                    rec.error = _error_text(json.dumps({"error": err.get("error", {})}), status)
                    rec.fate = "refused" if status in REFUSED_STATUSES else "failed"
                event, data = "message", []
        if rec.fate != "completed" and rec.error is None:
            rec.fate, rec.error = "failed", "stream ended without a run event"


async def send_one(client: httpx.AsyncClient, url: str, req: PlannedRequest, rec: RequestRecord,
               stream: bool) -> None:
    """Send one request and fill ``rec`` in; never raises but ``CancelledError``."""
    t0 = time.perf_counter()
    try:
        if stream:
            await _send_stream(client, url, req, rec, t0)
        else:
            await _send_plain(client, url, req, rec)
    except httpx.TimeoutException as exc:
        rec.fate, rec.error = "failed", f"timeout: {type(exc).__name__}"
    except httpx.HTTPError as exc:
        rec.fate, rec.error = "failed", f"transport: {type(exc).__name__}: {exc}"
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        rec.fate, rec.error = "failed", f"bad response: {type(exc).__name__}: {exc}"

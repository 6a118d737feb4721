"""The real parts around a traced server, for tests/obs: an OTLP/HTTP receiver that decodes what the
server exports (opentelemetry-proto), a SearXNG stub behind its text search, and span helpers."""


from __future__ import annotations

import gzip
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from ssr_server.core import tracing

SEARCH_ONLY = """\
name: search-only
description: One rationale, which looks a fact up.
candidates:
  - id: look_it_up
    text: I should look the fact up with a text search before answering the question.
    action: text_search
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class SpanRec:
    name: str
    trace_id: str
    span_id: str
    parent: str | None
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status: int  # 0 unset, 1 ok, 2 error
    service: str

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def decode(body: bytes) -> list[SpanRec]:
    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    out = []
    for rs in req.resource_spans:
        res = {a.key: _value(a.value) for a in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(SpanRec(
                    name=s.name, trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                    parent=s.parent_span_id.hex() or None, kind=s.kind, start_ns=s.start_time_unix_nano,
                    end_ns=s.end_time_unix_nano, attributes={a.key: _value(a.value) for a in s.attributes},
                    status=s.status.code, service=str(res.get("service.name"))))
    return out


class _Server:
    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
        self.httpd.owner = self  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


class _OtlpHandler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        receiver: OtlpReceiver = self.server.owner  # type: ignore[attr-defined]
        if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
            self.send_response(404)
            self.end_headers()
            return
        spans = decode(body)
        with receiver.lock:
            receiver.spans.extend(spans)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


class OtlpReceiver(_Server):
    def __init__(self) -> None:
        self.spans: list[SpanRec] = []
        self.lock = threading.Lock()
        super().__init__(_OtlpHandler)

    def trace(self, trace_id: str) -> list[SpanRec]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait(self, found: Callable[[list[SpanRec]], list[SpanRec]], timeout_s: float = 20.0) -> list[SpanRec]:
        """Flushes the server's spans until ``found(all spans)`` is non-empty; returns it."""
        deadline = time.monotonic() + timeout_s
        while True:
            tracing.flush()
            with self.lock:
                hit = found(list(self.spans))
            if hit or time.monotonic() > deadline:
                return hit
            time.sleep(0.05)

    def trace_of_run(self, run_id: str, timeout_s: float = 20.0) -> list[SpanRec]:
        """The whole trace holding the ``ssr.run`` span of ``run_id`` (once its server span is in)."""

        def found(spans: list[SpanRec]) -> list[SpanRec]:
            runs = [s for s in spans if s.name == "ssr.run" and s.attributes.get("ssr.run_id") == run_id]
            if not runs:
                return []
            trace = [s for s in spans if s.trace_id == runs[0].trace_id]
            return trace if any(s.kind == 2 for s in trace) else []  # SPAN_KIND_SERVER

        return self.wait(found, timeout_s)


class _SearxHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        stub: SearxStub = self.server.owner  # type: ignore[attr-defined]
        stub.traceparents.append(self.headers.get("traceparent"))
        if stub.fail:
            body, status = b"backend exploded", 500
        else:
            body, status = json.dumps({"results": [
                {"title": "Eiffel Tower", "url": "https://example.org/eiffel",
                 "content": "The Eiffel Tower is 330 metres tall."}]}).encode(), 200
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if status == 200 else "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class SearxStub(_Server):
    def __init__(self) -> None:
        self.fail = False
        self.traceparents: list[str | None] = []
        super().__init__(_SearxHandler)


@dataclass
class Traced:
    url: str
    receiver: OtlpReceiver
    searx: SearxStub
    clients: list[httpx.Client] = field(default_factory=list)

    def client(self) -> httpx.Client:
        """An HTTP client of the test, left out of the httpx instrumentation (its own client spans
        would parent the server's, and overwrite a ``traceparent`` the test sends)."""
        from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

        c = httpx.Client(base_url=self.url, timeout=120)
        HTTPXClientInstrumentor.uninstrument_client(c)
        self.clients.append(c)
        return c


def children(spans: list[SpanRec], parent: SpanRec, name: str | None = None) -> list[SpanRec]:
    return sorted((s for s in spans if s.parent == parent.span_id and (name is None or s.name == name)),
                  key=lambda s: s.start_ns)


def one(spans: list[SpanRec], name: str) -> SpanRec:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, f"{len(found)} spans named {name!r}: {[s.name for s in spans]}"
    return found[0]


ROOT = Path(__file__).resolve().parents[2]

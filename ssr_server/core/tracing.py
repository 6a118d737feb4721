"""OpenTelemetry traces: one trace per request, spans for the run, its turns, selections, actions, tools.

Off unless the standard variables ask for it: ``OTEL_TRACES_EXPORTER=otlp`` or an OTLP endpoint
(``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), and ``OTEL_SDK_DISABLED``
not ``true``. Everything else is the SDK's own reading of ``OTEL_*``: the sampler
(``OTEL_TRACES_SAMPLER``, ``OTEL_TRACES_SAMPLER_ARG``), the resource (``OTEL_SERVICE_NAME``, default
``ssr-server``, ``OTEL_RESOURCE_ATTRIBUTES``), the exporter (OTLP over HTTP: endpoint, headers, timeout)
and the batch processor (``OTEL_BSP_*``).

Off, the SDK is never imported and ``span`` hands out one shared object that does nothing, so the agent's
spans cost a few attribute calls per turn. On, spans go through a ``BatchSpanProcessor``
(exported from its own thread) and ``current_ids`` names the span a metric observation or a log line
belongs to (exemplars, JSON logs).

The provider is this module's, not the process-global one (which can be set only once): the server's
spans, the FastAPI server span and the httpx client spans all use ``provider()``; ``shutdown`` flushes it
and turns tracing off again (a test can start another server with other settings).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span as OtelSpan
    from opentelemetry.trace import Tracer

AttrValue = str | bool | int | float
SERVICE_NAME = "ssr-server"
EXEMPLAR_TRACE_LABEL = "trace_id"  # Grafana's Prometheus datasource links this exemplar label to traces
EXPORTERS = ("otlp", "console")

_provider: TracerProvider | None = None
_tracer: Tracer | None = None


def wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks for traces (see the module's docstring)."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = {e.strip().lower() for e in env.get("OTEL_TRACES_EXPORTER", "").split(",") if e.strip()}
    if exporters:
        return bool(exporters & set(EXPORTERS))
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def enabled() -> bool:
    return _tracer is not None


def provider() -> TracerProvider | None:
    return _provider


def configure() -> bool:
    """Start tracing if the environment asks for it and it is not on yet; True when it is on."""
    global _provider, _tracer
    if _tracer is not None:
        return True
    if not wanted():
        return False
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
    tp = TracerProvider(resource=resource)  # the sampler: OTEL_TRACES_SAMPLER(_ARG)
    exporters = {e.strip().lower() for e in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")}
    chosen: list[SpanExporter] = []
    if "otlp" in exporters:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        chosen.append(OTLPSpanExporter())
    if "console" in exporters:
        chosen.append(ConsoleSpanExporter())
    for exporter in chosen:
        tp.add_span_processor(BatchSpanProcessor(exporter))
    _instrument_httpx(tp)
    _provider, _tracer = tp, tp.get_tracer("ssr_server")
    return True


def _instrument_httpx(tp: TracerProvider) -> None:
    """Client spans for every httpx client (tool backends, SGLang, image URLs), carrying ``traceparent``."""
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    instrumentor = HTTPXClientInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.uninstrument()
    instrumentor.instrument(tracer_provider=tp)


def flush(timeout_s: float = 5.0) -> None:
    if _provider is not None:
        _provider.force_flush(int(timeout_s * 1000))


def shutdown() -> None:
    """Export what is left and turn tracing off."""
    global _provider, _tracer
    if _provider is None:
        return
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    HTTPXClientInstrumentor().uninstrument()
    _provider.shutdown()
    _provider, _tracer = None, None


class Span:
    """What the agent may do with its span: add attributes, mark it failed. A no-op when tracing is off."""

    __slots__ = ("_span",)

    def __init__(self, span: OtelSpan | None) -> None:
        self._span = span

    def set(self, attributes: Mapping[str, AttrValue | None]) -> None:
        if self._span is not None:
            self._span.set_attributes({k: v for k, v in attributes.items() if v is not None})

    def fail(self, description: str) -> None:
        if self._span is not None:
            from opentelemetry.trace import Status, StatusCode

            self._span.set_status(Status(StatusCode.ERROR, description))


NO_SPAN = Span(None)


class _NoSpanBlock:
    """The block of a span when tracing is off: one shared object, no generator, no context change."""

    def __enter__(self) -> Span:
        return NO_SPAN

    def __exit__(self, *exc: object) -> None:
        return None


_NO_BLOCK = _NoSpanBlock()


def span(name: str, attributes: Mapping[str, AttrValue | None] | None = None,
         ) -> AbstractContextManager[Span]:
    """A child of the current span (the request's, or the caller's ``traceparent``), current inside the
    block; an exception leaving the block is recorded on it and marks it failed."""
    if _tracer is None:
        return _NO_BLOCK
    return _live_span(_tracer, name, attributes)


@contextmanager
def _live_span(tracer: Tracer, name: str, attributes: Mapping[str, AttrValue | None] | None,
               ) -> Iterator[Span]:
    attrs = {k: v for k, v in (attributes or {}).items() if v is not None}
    with tracer.start_as_current_span(name, attributes=attrs) as s:
        yield Span(s)


def current_ids() -> tuple[str, str] | None:
    """(trace id, span id) in hex of the current span when it is sampled, else None."""
    if _tracer is None:
        return None
    from opentelemetry.trace import get_current_span

    ctx = get_current_span().get_span_context()
    if not ctx.is_valid or not ctx.trace_flags.sampled:
        return None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


def exemplar() -> dict[str, str] | None:
    """The labels of a Prometheus exemplar pointing at the current span (None: no sampled span)."""
    ids = current_ids()
    return None if ids is None else {EXEMPLAR_TRACE_LABEL: ids[0], "span_id": ids[1]}


def instrument_app(app: Any) -> None:
    """The HTTP server span of every request (FastAPI instrumentation), parented on the caller's W3C
    ``traceparent``. Nothing when tracing is off. Probes and metrics are left out: scrapes and health
    checks would drown the traces of the work."""
    if _provider is None:
        return
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    FastAPIInstrumentor.instrument_app(app, tracer_provider=_provider,
                                       excluded_urls="/health,/ready,/metrics")

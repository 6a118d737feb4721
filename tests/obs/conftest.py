"""Fixtures of the observability tests: a traced server and the real parts around it (``otel_parts``).

- ``OtlpReceiver``: an OTLP/HTTP trace receiver (``POST /v1/traces``) on 127.0.0.1 that decodes each
  protobuf payload with opentelemetry-proto's ``ExportTraceServiceRequest`` and keeps the spans;
- ``SearxStub``: a SearXNG JSON API on 127.0.0.1 behind the server's text search tool; it records the
  ``traceparent`` of each request it gets and answers 500 while ``fail`` is set (a failing tool);
- ``traced``: one real uvicorn server (``ssr_server.bench.serve.live_server``) on the session's tiny engine
  with tracing on (the standard ``OTEL_*`` variables, exported to the receiver), the demo world's zoom
  and image search, the stub's text search, and a ``search-only`` library whose one rationale searches.

Tracing is the module's own provider (``ssr_server.core.tracing``): it is shut down after each test
module that starts a traced server (module scope: a directory without ``__init__.py`` is no package, so
a "package" fixture would live to the end of the session and leave the rest of the suite traced).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from otel_parts import SEARCH_ONLY, OtlpReceiver, SearxStub, Traced

from ssr_server.bench.serve import live_server
from ssr_server.core import tracing
from ssr_server.core.config import Settings
from ssr_server.tools.demo import shipped_demo_world
from ssr_server.tools.registry import build_registry


@pytest.fixture(scope="module")
def otlp() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def traced(otlp: OtlpReceiver, torch_engine: Any,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traced]:
    libs = tmp_path_factory.mktemp("libraries")
    (libs / "search-only.yaml").write_text(SEARCH_ONLY)
    searx = SearxStub()
    world = shipped_demo_world()
    mp = pytest.MonkeyPatch()
    mp.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{otlp.url}/v1/traces")
    mp.setenv("OTEL_SERVICE_NAME", "ssr-server-under-test")
    mp.setenv("OTEL_TRACES_SAMPLER", "parentbased_always_on")
    mp.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    tracing.shutdown()
    tools = build_registry(searxng_url=searx.url, image_index_dir=world.image_dir)
    settings = Settings(library_dirs=(str(libs),), max_concurrent_runs=4)
    try:
        with live_server(settings, torch_engine, tools) as url:
            assert tracing.enabled(), "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT did not turn tracing on"
            t = Traced(url, otlp, searx)
            yield t
            for c in t.clients:
                c.close()
    finally:
        tracing.shutdown()
        mp.undo()
        searx.close()


@pytest.fixture(scope="session")
def demo_png_b64() -> str:
    import base64
    import io

    from ssr_server.tools.demo import demo_picture

    img = demo_picture(shipped_demo_world().entity_ids()[0])
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()



"""Tracing is off unless the standard variables ask for it, and off it never loads the SDK, the exporter
or the instrumentations."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ssr_server.core import tracing


@pytest.mark.parametrize(("env", "on"), [
    ({}, False),
    ({"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"}, False),  # no exporter named
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
    ({"OTEL_TRACES_EXPORTER": "console"}, True),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, False),
    ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, False),
    ({"OTEL_SDK_DISABLED": "false", "OTEL_TRACES_EXPORTER": "otlp"}, True),
])
def test_tracing_is_wanted_only_when_the_environment_asks(env: dict[str, str], on: bool) -> None:
    assert tracing.wanted(env) is on


def test_off_the_app_and_a_run_never_import_the_sdk() -> None:
    code = """
import asyncio, sys
from ssr_server.api.app import create_app
from ssr_server.core import metrics, tracing
from ssr_server.core.config import Settings
create_app(Settings())
with tracing.span("ssr.run", {"ssr.mode": "ssr"}) as span:
    span.set({"ssr.outcome": "answered"})
    span.fail("no-op")
    assert tracing.current_ids() is None
    metrics.observe_run("ssr", "answered", 0.1, 0.05, 1)
# FastAPI itself imports the OpenTelemetry API (its own telemetry, idle without a provider); the SDK,
# the exporter and the instrumentations are ours to load, and only for tracing
heavy = ("opentelemetry.sdk", "opentelemetry.exporter", "opentelemetry.instrumentation")
loaded = sorted(m for m in sys.modules if m.startswith(heavy))
assert not tracing.enabled() and not loaded, loaded
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]

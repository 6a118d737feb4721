"""``SSR_LOG_FORMAT=json`` on a real ``ssr-server serve`` process that also exports its traces: every
line it writes is one JSON object, with one line per request and one per finished run, and those lines
name the same trace and spans as the spans it exported."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from otel_parts import OtlpReceiver, free_port

START_S = 120.0


def test_json_logs_carry_the_ids_of_the_exported_spans(tiny_model_dir: Path, otlp: OtlpReceiver,
                                                        tmp_path: Path, demo_png_b64: str) -> None:
    port = free_port()
    env = {**os.environ, "SSR_CACHE_DIR": str(tmp_path / "cache"), "SSR_TORCH_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "SSR_LOG_FORMAT": "json",
           "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{otlp.url}/v1/traces", "OTEL_BSP_SCHEDULE_DELAY": "100",
           "OTEL_SERVICE_NAME": "ssr-json-logs"}
    log = tmp_path / "serve.log"
    cmd = [sys.executable, "-m", "ssr_server.cli", "serve", "--model", str(tiny_model_dir),
           "--host", "127.0.0.1", "--port", str(port), "--log-level", "info"]
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_S
        while True:
            assert proc.poll() is None, f"the server exited during start-up\n{log.read_text()[-3000:]}"
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/ready", timeout=5).status_code == 200:
                    break
            assert time.monotonic() < deadline, f"not ready in {START_S:g} s\n{log.read_text()[-3000:]}"
            time.sleep(0.2)
        r = httpx.post(f"{url}/v1/agent/runs", timeout=120, json={
            "question": "Which landmark is this?", "images": [demo_png_b64], "seed": 1, "max_turns": 2})
        assert r.status_code == 200, r.text
        run = r.json()
        spans = otlp.trace_of_run(run["id"])
        assert spans, "the process exported no trace of the run"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    lines = [ln for ln in log.read_text().splitlines() if ln.strip()]
    records: list[dict[str, Any]] = []
    for ln in lines:
        try:
            records.append(json.loads(ln))
        except ValueError:
            raise AssertionError(f"a log line is not JSON: {ln!r}") from None
    assert all({"time", "level", "logger", "message"} <= set(rec) for rec in records)
    assert any(rec["logger"].startswith("uvicorn") for rec in records)  # uvicorn's own lines too
    root = next(s for s in spans if s.name == "ssr.run")
    server = next(s for s in spans if s.kind == 2)
    assert root.service == "ssr-json-logs"
    (run_line,) = [rec for rec in records if rec.get("event") == "run" and rec.get("run_id") == run["id"]]
    assert run_line["outcome"] == run["outcome"]
    assert run_line["turns"] == len(run["turns"])
    assert run_line["mode"] == "ssr"
    assert run_line["total_s"] > 0
    assert (run_line["trace_id"], run_line["span_id"]) == (root.trace_id, root.span_id)
    requests = [rec for rec in records if rec.get("event") == "request" and rec["path"] == "/v1/agent/runs"]
    assert len(requests) == 1
    req = requests[0]
    assert (req["method"], req["status"]) == ("POST", 200)
    assert req["duration_s"] >= run["timings"]["total_s"]
    assert (req["trace_id"], req["span_id"]) == (server.trace_id, server.span_id)
    assert not [rec for rec in records if rec["logger"] == "uvicorn.access"]  # replaced by the line above

"""Exemplars: the latency histograms name the trace of a sampled observation. /metrics gives them in
OpenMetrics when the scraper asks for it; a real Prometheus (Debian's, with exemplar storage) scrapes the
traced server and its exemplar query answers with the trace ids of the runs the server exported."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest
from otel_parts import SpanRec, Traced, free_port
from prometheus_client.openmetrics.parser import text_string_to_metric_families

OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
PROMETHEUS_INSTALL = "apt-get install -y --no-install-recommends prometheus"


def runs(traced: Traced, png: str) -> list[dict[str, Any]]:
    c = traced.client()
    out = []
    for body in ({"question": "Which landmark is this?", "images": [png], "tau": 1.0, "seed": 1,
                  "max_turns": 3},
                 {"question": "How tall is it?", "images": [png], "mode": "freeform", "max_turns": 1,
                  "reasoning_budget": 4, "seed": 2}):
        r = c.post("/v1/agent/runs", json=body)
        assert r.status_code == 200, r.text
        out.append(r.json())
    return out


def run_spans(traced: Traced, done: list[dict[str, Any]]) -> dict[str, SpanRec]:
    """The ``ssr.run`` span of each run, by run id."""
    spans = {}
    for run in done:
        trace = traced.receiver.trace_of_run(run["id"])
        spans[run["id"]] = next(s for s in trace if s.name == "ssr.run")
    return spans


def test_openmetrics_exposition_carries_the_exemplars_of_runs_and_turns(traced: Traced,
                                                                         demo_png_b64: str) -> None:
    done = runs(traced, demo_png_b64)
    roots = run_spans(traced, done)
    c = traced.client()
    plain = c.get("/metrics")
    assert plain.headers["content-type"].startswith("text/plain")
    assert "trace_id" not in plain.text  # the Prometheus text format has no exemplars
    r = c.get("/metrics", headers={"Accept": OPENMETRICS})
    assert r.headers["content-type"].startswith("application/openmetrics-text")
    exemplars: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            if sample.exemplar is not None:
                exemplars.setdefault(family.name, []).append(dict(sample.exemplar.labels))
    for name in ("ssr_run_seconds", "ssr_run_model_seconds", "ssr_reasoning_seconds", "ssr_action_seconds",
                 "ssr_turn_seconds"):
        assert exemplars.get(name), f"{name} has no exemplar"
    # each freeform histogram's newest exemplar is the freeform run's (the last one of its mode)
    freeform = roots[done[1]["id"]]
    run_ex = [e for e in exemplars["ssr_run_seconds"] if e["trace_id"] == freeform.trace_id]
    assert run_ex and all(e["span_id"] == freeform.span_id for e in run_ex)
    for e in (e for ex in exemplars.values() for e in ex):  # other modules' runs may own some buckets
        assert len(e["trace_id"]) == 32 and len(e["span_id"]) == 16, e


@pytest.fixture()
def prometheus(traced: Traced) -> Iterator[str]:
    binary = shutil.which("prometheus")
    assert binary, f"prometheus is not installed; install it with: {PROMETHEUS_INSTALL}"
    target = urlparse(traced.url).netloc
    port = free_port()
    with tempfile.TemporaryDirectory() as d:
        config = Path(d) / "prometheus.yml"
        config.write_text(f"""global:
  scrape_interval: 1s
scrape_configs:
  - job_name: agent
    static_configs:
      - targets: ["{target}"]
""")
        proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={d}/data",
             f"--web.listen-address=127.0.0.1:{port}", "--enable-feature=exemplar-storage"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            while True:
                assert proc.poll() is None, (proc.stderr.read() if proc.stderr else b"").decode()[-2000:]
                try:
                    if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "prometheus did not become ready in 30 s"
                time.sleep(0.2)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def test_prometheus_stores_exemplars_that_name_real_runs(traced: Traced, demo_png_b64: str,
                                                         prometheus: str) -> None:
    done = runs(traced, demo_png_b64)
    roots = run_spans(traced, done)
    wanted = {s.trace_id for s in roots.values()}
    start = time.time() - 600
    found: dict[str, dict[str, str]] = {}
    deadline = time.monotonic() + 30
    while not wanted <= set(found) and time.monotonic() < deadline:
        time.sleep(0.5)
        r = httpx.get(f"{prometheus}/api/v1/query_exemplars",
                      params={"query": "ssr_run_seconds_bucket", "start": start, "end": time.time() + 60})
        assert r.status_code == 200, r.text
        for series in r.json()["data"]:
            assert series["seriesLabels"]["__name__"] == "ssr_run_seconds_bucket"
            for ex in series["exemplars"]:
                found[ex["labels"]["trace_id"]] = ex["labels"]
    assert wanted <= set(found), f"exemplars of {sorted(found)}, runs traced {sorted(wanted)}"
    for root in roots.values():
        assert found[root.trace_id]["span_id"] == root.span_id
    # and the reasoning histogram's exemplars point at turn spans of those traces
    r = httpx.get(f"{prometheus}/api/v1/query_exemplars",
                  params={"query": "ssr_reasoning_seconds_bucket", "start": start, "end": time.time() + 60})
    turn_ids = {(s.trace_id, s.span_id) for s in traced.receiver.spans if s.name == "ssr.turn"}
    pairs = {(e["labels"]["trace_id"], e["labels"]["span_id"]) for series in r.json()["data"]
             for e in series["exemplars"]}
    ours = {p for p in pairs if p[0] in wanted}
    assert ours and ours <= turn_ids

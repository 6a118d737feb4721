"""The load generator and its report against a real server (tiny engine, demo tools) on 127.0.0.1.

Every request sent must end as exactly one of completed / failed / refused; the report's figures must
be consistent; the files must be written; non-loopback targets must be refused before anything is sent.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from ssr_server.bench.serve import live_server
from ssr_server.core.config import Settings
from ssr_server.loadtest import (
    LoadResult,
    RemoteTargetError,
    Workload,
    check_target,
    format_table,
    is_loopback,
    parse_mix,
    run_load,
    summarize,
    write_report,
)

# short freeform reasoning keeps a freeform run well under a second on the tiny model
SHORT = {"reasoning_budget": 16}


def _assert_accounted(result: LoadResult, sent: int) -> None:
    assert result.sent == sent
    assert result.count("completed") + result.count("failed") + result.count("refused") == sent
    assert sorted(r.index for r in result.records) == list(range(sent))  # each exactly once


def _assert_ordered(p: dict[str, Any]) -> None:
    vals = [p[k] for k in ("p50", "p95", "p99") if k in p]
    assert all(v is not None for v in vals)
    assert vals == sorted(vals)
    assert p["max"] >= vals[-1]


async def test_closed_loop_mix_counts_and_report(server_url: str, tmp_path: Path) -> None:
    result = await run_load(server_url, concurrency=3, requests=12, duration_s=60,
                            modes={"ssr": 0.5, "freeform": 0.5}, with_images=0.5, max_turns=2,
                            timeout_s=60, slo_s=30, seed=1, progress=False, extra_body=SHORT)
    _assert_accounted(result, 12)
    assert result.loop == "closed"
    assert result.count("completed") == 12, [r.error for r in result.records if r.error]
    assert {r.mode for r in result.records} == {"ssr", "freeform"}
    assert any(r.with_image for r in result.records) and not all(r.with_image for r in result.records)
    for r in result.records:
        assert r.status == 200 and r.outcome in ("answered", "max_turns", "error")
        assert 1 <= r.turns <= 2 and len(r.reasoning_s) == r.turns
        assert r.model_s is not None and r.model_s <= r.latency_s
        assert 0 <= r.start_s <= r.end_s and r.latency_s == pytest.approx(r.end_s - r.start_s)

    summary, js, png = write_report(result, tmp_path / "out")
    assert summary["sent"] == 12 and summary["completed"] + summary["failed"] + summary["refused"] == 12
    assert summary["throughput_rps"] > 0
    assert 0 <= summary["goodput_rps"] <= summary["throughput_rps"]
    _assert_ordered(summary["latency_s"])
    assert set(summary["modes"]) == {"ssr", "freeform"}
    for g in summary["modes"].values():
        _assert_ordered(g["latency_s"])
        _assert_ordered(g["reasoning_s"])
        assert g["model_s"]["p50"] <= g["model_s"]["p95"]
        assert g["completed"] > 0 and g["throughput_rps"] > 0
    assert sum(g["sent"] for g in summary["modes"].values()) == 12
    assert sum(b["completions"] for b in summary["timeline"]) == 12

    data = json.loads(js.read_text())
    assert data["completed"] == 12 and len(data["records"]) == 12
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    table = format_table(summary)
    assert "ssr" in table and "freeform" in table and "goodput" in table


async def test_open_loop_poisson(server_url: str) -> None:
    result = await run_load(server_url, rate=10.0, requests=5, duration_s=20, modes={"ssr": 1.0},
                            with_images=1.0, max_turns=2, timeout_s=60, seed=2, progress=False)
    _assert_accounted(result, 5)
    assert result.loop == "open" and result.count("completed") == 5
    starts = [r.scheduled_s for r in sorted(result.records, key=lambda r: r.index)]
    assert starts == sorted(starts) and starts[0] > 0
    for r in result.records:
        assert r.sched_latency_s >= r.latency_s - 1e-6
    s = summarize(result)
    assert s["offered_rps"] is not None and s["offered_rps"] > 0
    assert s["throughput_rps"] > 0 and s["modes"]["ssr"]["completed"] == 5


async def test_duration_bounds_the_launches(server_url: str) -> None:
    result = await run_load(server_url, rate=20.0, requests=1000, duration_s=0.3, max_turns=1, timeout_s=30,
                            progress=False)
    assert 0 < result.sent < 30  # ~6 expected in 0.3 s at 20/s; never the 1000 asked for
    assert all(r.scheduled_s < 0.3 for r in result.records)  # nothing was due after the duration
    _assert_accounted(result, result.sent)


async def test_overload_is_counted_as_refused(torch_engine: Any, demo_tools: Any) -> None:
    with live_server(Settings(max_concurrent_runs=1, max_queued_runs=0), torch_engine, demo_tools) as url:
        result = await run_load(url, concurrency=6, requests=6, modes={"freeform": 1.0}, with_images=0,
                                max_turns=1, timeout_s=60, progress=False,
                                extra_body={"reasoning_budget": 64})
    _assert_accounted(result, 6)
    refused = [r for r in result.records if r.fate == "refused"]
    assert refused and result.count("completed") >= 1
    assert all(r.status == 429 and r.retry_after_s is not None and r.retry_after_s >= 1 for r in refused)
    s = summarize(result)
    assert s["refused"] == len(refused) and s["retry_after_s"]["n"] == len(refused)


async def test_transport_errors_are_counted_as_failed() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens once the socket is closed
    result = await run_load(f"http://127.0.0.1:{port}", concurrency=2, requests=4, timeout_s=5,
                            progress=False)
    _assert_accounted(result, 4)
    assert result.count("failed") == 4 and all(r.status is None and r.error for r in result.records)
    s = summarize(result)
    assert s["completed"] == 0 and s["throughput_rps"] == 0 and s["latency_s"]["p50"] is None
    assert "failed" in format_table(s) or "fail" in format_table(s)


async def test_api_key_is_sent(torch_engine: Any, demo_tools: Any) -> None:
    with live_server(Settings(api_key="sekret"), torch_engine, demo_tools) as url:
        bad = await run_load(url, concurrency=1, requests=1, max_turns=1, progress=False)
        good = await run_load(url, concurrency=1, requests=1, max_turns=1, progress=False, api_key="sekret")
    assert bad.records[0].fate == "failed" and bad.records[0].status == 401
    assert good.records[0].fate == "completed"


@pytest.mark.parametrize("target", ["http://10.1.2.3:8000", "http://example.com", "https://8.8.8.8",
                                    "http://127.0.0.1.example.com:80", "http://[2001:db8::1]:8000"])
async def test_non_loopback_targets_are_refused(target: str) -> None:
    assert not is_loopback(target)
    with pytest.raises(RemoteTargetError):
        await run_load(target, concurrency=1, requests=1, progress=False)
    with pytest.raises(RemoteTargetError):
        check_target(target)
    assert check_target(target, allow_remote=True) == target.rstrip("/")


@pytest.mark.parametrize("target", ["http://127.0.0.1:8000", "http://127.5.6.7", "http://localhost:9/",
                                    "http://[::1]:8000", "https://LOCALHOST"])
def test_loopback_targets_are_accepted(target: str) -> None:
    assert is_loopback(target)
    assert check_target(target) == target.rstrip("/")


def test_bad_arguments() -> None:
    import asyncio

    for kwargs in ({}, {"rate": 1.0, "concurrency": 1}, {"rate": 0.0}, {"concurrency": 0},
                   {"concurrency": 1, "modes": {"nope": 1.0}}, {"concurrency": 1, "with_images": 2.0}):
        with pytest.raises(ValueError):
            asyncio.run(run_load("http://127.0.0.1:9", requests=1, progress=False, **kwargs))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        check_target("ftp://127.0.0.1/")
    assert parse_mix("ssr=3, freeform=1") == {"ssr": 3.0, "freeform": 1.0}
    assert parse_mix("ssr") == {"ssr": 1.0}


def test_workload_is_deterministic() -> None:
    a = Workload({"ssr": 1, "freeform": 1}, 0.5, 3, seed=5)
    b = Workload({"ssr": 1, "freeform": 1}, 0.5, 3, seed=5)
    reqs = [a.request(i) for i in range(20)]
    assert reqs == [b.request(i) for i in range(20)]
    assert {r.mode for r in reqs} == {"ssr", "freeform"}
    with_img = [r for r in reqs if r.with_image]
    assert with_img and all(r.body["images"][0].startswith("iVBORw0KGgo") for r in with_img)  # PNG
    assert all("images" not in r.body for r in reqs if not r.with_image)
    assert len({r.body["seed"] for r in reqs}) == 20

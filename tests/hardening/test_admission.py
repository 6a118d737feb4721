"""Overload: twice the admitted capacity at once; every request is either served or refused with
Retry-After, none is lost, and the server still answers. Plus the per-run deadline."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.server
import json
import threading
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from ssr_server.core.config import Settings

OUTCOMES = {"answered", "max_turns", "error", "timeout"}
RUNNING, QUEUED = 2, 2
SENT = 2 * (RUNNING + QUEUED)  # twice what can be admitted at once
SELECT = {"messages": [{"role": "user", "content": "What is in the image?"}]}


def _sse_events(text: str) -> list[tuple[str, str]]:
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        name, data = "message", []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip())
        if data:
            events.append((name, "\n".join(data)))
    return events


def _fate(r: httpx.Response) -> str:
    """'completed' (200 with an explicit outcome) or 'refused' (429 with Retry-After); else fail."""
    if r.status_code == 429:
        retry_after = r.headers.get("retry-after")
        assert retry_after is not None and retry_after.isdigit() and int(retry_after) >= 1, r.headers
        assert r.json()["error"]["code"] == "overloaded"
        return "refused"
    assert r.status_code == 200, (r.status_code, r.text[:500])
    if r.headers["content-type"].startswith("text/event-stream"):
        events = _sse_events(r.text)
        assert events and events[-1][0] == "run", events[-1:]
        run = json.loads(events[-1][1])
        assert sum(1 for name, _ in events if name == "turn") == len(run["turns"])
    else:
        run = r.json()
    assert run["outcome"] in OUTCOMES, run["outcome"]
    assert run["turns"], run
    return "completed"


async def test_twice_the_capacity_is_served_or_refused_none_lost(serve: Any, long_run: Any,
                                                                  read_metric: Any) -> None:
    settings = Settings(max_concurrent_runs=RUNNING, max_queued_runs=QUEUED, run_deadline_s=60)
    with serve(settings) as live:
        overloaded_before = read_metric(live.url, "ssr_requests_rejected_total", reason="overloaded")
        # a first turn of 400 tokens (~1.6 s): long enough that all requests arrive while the first run.
        bodies = [long_run(reasoning_budget=400, max_turns=3, stream=(i % 4 == 3)) for i in range(SENT)]
        limits = httpx.Limits(max_connections=SENT + 2)
        async with httpx.AsyncClient(base_url=live.url, timeout=120, limits=limits) as client:
            peak = {"running": 0, "queued": 0}
            stop = asyncio.Event()

            async def watch() -> None:
                while not stop.is_set():
                    body = (await client.get("/ready")).json()
                    peak["running"] = max(peak["running"], body["runs_in_flight"])
                    peak["queued"] = max(peak["queued"], body["runs_queued"])
                    await asyncio.sleep(0.02)

            watcher = asyncio.create_task(watch())
            async with asyncio.timeout(90):
                responses = await asyncio.gather(*(client.post("/v1/agent/runs", json=b) for b in bodies),
                                                 return_exceptions=True)
            stop.set()
            await watcher
            errors = [r for r in responses if isinstance(r, BaseException)]
            assert not errors, errors  # none lost: every request got an HTTP answer
            fates = Counter(_fate(r) for r in responses if isinstance(r, httpx.Response))
            assert fates["completed"] + fates["refused"] == SENT, fates
            assert fates["refused"] >= 1, fates
            assert fates["completed"] >= RUNNING, fates
            # admission never ran more than allowed nor queued more than allowed
            assert peak["running"] <= RUNNING and peak["queued"] <= QUEUED, peak
            overloaded = read_metric(live.url, "ssr_requests_rejected_total", reason="overloaded")
            assert overloaded - overloaded_before == fates["refused"]

            # nothing leaked: no slot held, nothing queued, and a new run is admitted and served
            ready = (await client.get("/ready")).json()
            assert ready["runs_in_flight"] == 0 and ready["runs_queued"] == 0, ready
            r = await client.post("/v1/agent/runs", json=long_run(reasoning_budget=10, max_turns=1))
            assert _fate(r) == "completed"
            r = await client.post("/v1/ssr/select", json=SELECT)
            assert r.status_code == 200, r.text


async def test_queue_of_zero_refuses_at_once(serve: Any, long_run: Any) -> None:
    """max_queued_runs=0: only what can run is admitted; the rest is refused without waiting."""
    with serve(Settings(max_concurrent_runs=1, max_queued_runs=0)) as live:
        async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
            first = asyncio.create_task(client.post("/v1/agent/runs", json=long_run(2048, 1)))
            for _ in range(200):  # wait (bounded) until the first run holds the slot
                if (await client.get("/ready")).json()["runs_in_flight"] == 1:
                    break
                await asyncio.sleep(0.02)
            else:
                pytest.fail("the first run was never admitted")
            refused = await client.post("/v1/agent/runs", json=long_run(max_turns=1))
            assert _fate(refused) == "refused"
            select = await client.post("/v1/ssr/select", json=SELECT)
            assert select.status_code == 429 and select.headers.get("retry-after"), select.text
            assert _fate(await first) == "completed"
            assert _fate(await client.post("/v1/agent/runs", json=long_run(max_turns=1))) == "completed"


async def test_run_deadline_ends_with_timeout(serve: Any, long_run: Any, engine_load: Any,
                                             poll: Any) -> None:
    body = long_run(reasoning_budget=2048, max_turns=12)
    # The deadline is sized from this machine's own speed (CI cores are shared and noisy): the time
    # of 600 reasoning tokens, so the run is cut about a third into its first turn of 2048.
    with serve(Settings()) as live:
        async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
            r = await client.post("/v1/agent/runs", json={**body, "reasoning_budget": 200, "max_turns": 1})
        assert r.status_code == 200 and r.json()["turns"], r.text
        turn = r.json()["turns"][0]
        deadline = max(0.3, 3.0 * turn["reasoning_s"] * 200 / max(1, turn["reasoning_tokens"]))
    with serve(Settings(run_deadline_s=deadline)) as live:
        async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
            r = await client.post("/v1/agent/runs", json=body)
            assert r.status_code == 200, r.text
            run = r.json()
            turn_s = [t["turn_s"] for t in run["turns"]]
            assert run["outcome"] == "timeout", (run["outcome"], deadline, turn_s)
            assert "deadline" in (run["error"] or "")
            assert len(run["turns"]) < 12, len(run["turns"])
            # the same through the stream: turn events, then the run with outcome timeout
            r = await client.post("/v1/agent/runs", json={**body, "stream": True})
            assert r.status_code == 200
            events = _sse_events(r.text)
            assert events[-1][0] == "run", events[-1:]
            run = json.loads(events[-1][1])
            assert run["outcome"] == "timeout" and len(run["turns"]) < 12
            # the cut-off generation does not linger in the engine; the slot is free again
            assert await asyncio.to_thread(poll, lambda: engine_load() == 0, 5.0)
            ready = (await client.get("/ready")).json()
            assert ready["runs_in_flight"] == 0 and ready["ready"], ready


async def _until_in_flight(client: httpx.AsyncClient, n: int) -> None:
    async with asyncio.timeout(30):
        while True:
            if (await client.get("/ready")).json()["runs_in_flight"] == n:
                return
            await asyncio.sleep(0.02)


class _CountingImages:
    """A loopback HTTP server that serves one PNG and counts every request it gets."""

    def __init__(self, png: bytes) -> None:
        hits = self.hits = [0]

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hits[0] += 1
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Length", str(len(png)))
                self.end_headers()
                self.wfile.write(png)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/img.png"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def test_admission_is_decided_before_any_image_work(serve: Any, long_run: Any, read_metric: Any,
                                                        demo_image_b64: str) -> None:
    """A full server answers 429 before it fetches or decodes anything: the image server sees no
    request, and bytes that are no image get a 429, not the 400 that decoding them would give. When
    there is room, a bad image gets its 400 and gives the slot back."""
    images = _CountingImages(base64.b64decode(demo_image_b64))
    junk = base64.b64encode(b"not an image at all").decode()
    settings = Settings(max_concurrent_runs=1, max_queued_runs=0, allow_private_urls=True, run_deadline_s=60)
    try:
        with serve(settings) as live:
            async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
                before = read_metric(live.url, "ssr_requests_rejected_total", reason="overloaded")
                first = asyncio.create_task(client.post("/v1/agent/runs", json=long_run(2048, 12)))
                await _until_in_flight(client, 1)
                full = [
                    ("/v1/agent/runs", {"question": "x", "images": [images.url] * 4, "max_turns": 1}),
                    ("/v1/agent/runs", {"question": "x", "images": [junk], "max_turns": 1}),
                    ("/v1/ssr/select", {"messages": [{"role": "user", "content": [
                        {"type": "image", "image": images.url}, {"type": "text", "text": "What?"}]}]}),
                    ("/v1/ssr/select", {"messages": [{"role": "user", "content": [
                        {"type": "image", "image": junk}, {"type": "text", "text": "What?"}]}]}),
                ]
                for path, body in full:
                    r = await client.post(path, json=body)
                    assert r.status_code == 429, (path, r.status_code, r.text[:300])
                    assert r.headers.get("retry-after"), r.headers
                assert images.hits[0] == 0, "an image was fetched for a request that was refused"
                # not even the body is parsed: broken JSON, and a 6 MB body streamed in chunks, both
                # get their 429 (the client, still sending, receives it)
                r = await client.post("/v1/agent/runs", content=b"{not json",
                                      headers={"content-type": "application/json"})
                assert r.status_code == 429, r.text

                async def big() -> AsyncIterator[bytes]:
                    yield b'{"question": "x", "images": ["'
                    for _ in range(96):
                        yield b"A" * 65536
                    yield b'"]}'

                r = await client.post("/v1/agent/runs", content=big(),
                                      headers={"content-type": "application/json"})
                assert r.status_code == 429 and r.json()["error"]["code"] == "overloaded", r.text[:300]
                after = read_metric(live.url, "ssr_requests_rejected_total", reason="overloaded")
                assert after - before == len(full) + 2
                first.cancel()  # hang up: the server cancels the run and frees the slot
                with contextlib.suppress(asyncio.CancelledError):
                    await first
                await _until_in_flight(client, 0)

                one = {"question": "What is it?", "max_turns": 1}
                r = await client.post("/v1/agent/runs", json={**one, "images": [junk]})
                assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_image", r.text
                r = await client.post("/v1/agent/runs", json={**one, "images": [images.url]})
                assert r.status_code == 200, r.text[:300]  # the slot came back after the 400
                assert images.hits[0] == 1
    finally:
        images.close()

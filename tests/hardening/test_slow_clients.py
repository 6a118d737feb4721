"""Slow and idle clients: a body that does not come gets 408 and frees its slot; headers that trickle,
bodies that trickle after a refusal, connections left idle and oversized headers are all ended, and a
connection cap holds; a normal keep-alive client is not hurt. Real sockets against a real server on
127.0.0.1 (tests/conftest.py's ``live_server``: the uvicorn config `ssr-server serve` uses), with short
timeouts set for the test; every bound asserted is one of those timeouts plus generous slack."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest

from ssr_server.bench.raw_http import RawResponse, read_response, request_head
from ssr_server.core.config import Settings

RUN = json.dumps({"question": "What is this?", "max_turns": 1}).encode()
JSON = {"content-type": "application/json"}
WAIT_S = 30.0  # slack on top of a configured timeout: a busy 2-core machine may stall for seconds

Serve = Callable[[Settings], AbstractContextManager[str]]


@pytest.fixture(scope="module")
def serve(request: pytest.FixtureRequest, torch_engine: Any, demo_tools: Any) -> Serve:
    path = Path(__file__).resolve().parent.parent / "conftest.py"
    top = next(p for p in request.config.pluginmanager.get_plugins()
               if Path(getattr(p, "__file__", "") or "/").resolve() == path)
    return lambda settings: top.live_server(settings, torch_engine, demo_tools)  # type: ignore[no-any-return]


@contextlib.asynccontextmanager
async def _connection(url: str) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def _answer(reader: asyncio.StreamReader) -> RawResponse:
    return await asyncio.wait_for(read_response(reader), WAIT_S)


async def _closed_by_server(reader: asyncio.StreamReader) -> bool:
    """True once the server has closed the connection (EOF or reset), within WAIT_S."""
    try:
        async with asyncio.timeout(WAIT_S):
            while await reader.read(65536):
                pass
    except TimeoutError:
        return False
    except OSError:
        pass
    return True


async def _drip(writer: asyncio.StreamWriter, data: bytes) -> None:
    """``data`` a byte every 0.2 s, until the connection breaks or the task is cancelled."""
    with contextlib.suppress(OSError):
        for byte in data:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.2)


async def _until(url: str, **want: int) -> None:
    async with httpx.AsyncClient(timeout=WAIT_S) as client, asyncio.timeout(WAIT_S):
        while True:
            ready = (await client.get(f"{url}/ready")).json()
            if all(ready[k] == v for k, v in want.items()):
                return
            await asyncio.sleep(0.02)


async def test_a_body_that_does_not_come_gets_408_and_frees_the_slot(serve: Serve) -> None:
    """Headers and no body (or half a body, or nothing after 100 Continue): 408 once the body timeout
    has passed, the connection closed, and the slot free for the next run."""
    with serve(Settings(max_concurrent_runs=1, max_queued_runs=0, body_timeout_s=1.0)) as url:
        for expect, part in ((False, b""), (False, RUN[:10]), (True, b"")):
            async with _connection(url) as (reader, writer):
                writer.write(request_head("/v1/agent/runs", len(RUN), expect=expect) + part)
                if expect:
                    assert (await _answer(reader)).status == 100
                await _until(url, runs_in_flight=1)  # admitted: the slot is held meanwhile
                async with httpx.AsyncClient(base_url=url, timeout=WAIT_S) as client:
                    r = await client.post("/v1/agent/runs", content=RUN, headers=JSON)
                    assert r.status_code == 429, r.text
                late = await _answer(reader)
                assert late.status == 408, (expect, part, late)
                assert json.loads(late.body)["error"]["code"] == "request_timeout"
                assert late.headers.get("connection") == "close"
                assert await _closed_by_server(reader)
            await _until(url, runs_in_flight=0)
        async with httpx.AsyncClient(base_url=url, timeout=WAIT_S) as client:
            assert (await client.post("/v1/agent/runs", content=RUN, headers=JSON)).status_code == 200


async def test_headers_that_trickle_and_idle_connections_are_closed(serve: Serve) -> None:
    """50 clients sending their request line and headers a byte at a time, one that sends nothing and one
    that sends blank lines after a request are all closed after the header timeout, while a normal
    client is served meanwhile."""
    with serve(Settings(header_timeout_s=1.0)) as url:
        head = request_head("/v1/agent/runs", len(RUN))

        async def trickle() -> bool:
            async with _connection(url) as (reader, writer):
                dripping = asyncio.create_task(_drip(writer, head))  # 5 bytes/s: 20 s of headers
                try:
                    return await _closed_by_server(reader)
                finally:
                    dripping.cancel()

        async def idle() -> bool:
            async with _connection(url) as (reader, _):
                return await _closed_by_server(reader)

        async def blank_lines() -> bool:  # after a request, on the kept-alive connection
            async with _connection(url) as (reader, writer):
                writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                assert (await _answer(reader)).status == 200
                dripping = asyncio.create_task(_drip(writer, b"\r\n" * 200))
                try:
                    return await _closed_by_server(reader)
                finally:
                    dripping.cancel()

        slow = [asyncio.create_task(trickle()) for _ in range(50)]
        slow += [asyncio.create_task(idle()), asyncio.create_task(blank_lines())]
        async with httpx.AsyncClient(base_url=url, timeout=WAIT_S) as client:
            assert (await client.get("/health")).status_code == 200
        assert all(await asyncio.gather(*slow))


async def test_a_refused_body_that_trickles_is_cut_and_idle_connections_close(serve: Serve) -> None:
    """50 clients send headers and then a byte of body at a time: the one admitted gets 408, the others
    their 429 at once; every connection is closed within the body timeout. A refused client that sent
    its body whole keeps its connection until the keep-alive timeout (uvicorn alone left it open)."""
    settings = Settings(max_concurrent_runs=1, max_queued_runs=0, body_timeout_s=1.0, keep_alive_s=1.0)
    with serve(settings) as url:

        async def trickle() -> tuple[int, bool]:
            async with _connection(url) as (reader, writer):
                writer.write(request_head("/v1/agent/runs", 100_000))
                dripping = asyncio.create_task(_drip(writer, b" " * 100_000))
                try:
                    answer = await _answer(reader)
                    return answer.status, await _closed_by_server(reader)
                finally:
                    dripping.cancel()

        results = await asyncio.gather(*(trickle() for _ in range(50)))
        assert sorted(s for s, _ in results) == [408] + [429] * 49, results
        assert all(closed for _, closed in results), results
        await _until(url, runs_in_flight=0)

    # full server: a refused client sends its body whole, then idles
    settings = Settings(max_concurrent_runs=1, max_queued_runs=0, body_timeout_s=60.0, keep_alive_s=1.0)
    with serve(settings) as url:
        async with _connection(url) as (reader, writer), _connection(url) as (h_reader, h_writer):
            h_writer.write(request_head("/v1/agent/runs", len(RUN), expect=True))
            assert (await _answer(h_reader)).status == 100
            body = b" " * 1_000_000
            writer.write(request_head("/v1/agent/runs", len(body)) + body)
            assert (await _answer(reader)).status == 429
            assert await _closed_by_server(reader)  # idle after its body: keep-alive ends it
            h_writer.write(RUN)
            assert (await _answer(h_reader)).status == 200


async def test_keep_alive_clients_are_not_hurt(serve: Serve) -> None:
    """Requests one after another on one connection, with pauses well under the keep-alive timeout and
    over the header timeout, are all answered on that connection."""
    with serve(Settings(header_timeout_s=0.5, keep_alive_s=30.0)) as url:
        async with _connection(url) as (reader, writer):
            for _ in range(3):
                writer.write(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                assert (await _answer(reader)).status == 200
                await asyncio.sleep(1.0)  # idle between requests: the header timeout does not apply
            writer.write(request_head("/v1/agent/runs", len(RUN)) + RUN)
            assert (await _answer(reader)).status == 200


async def test_oversized_headers_get_431_and_the_connection_cap_holds(serve: Serve) -> None:
    with serve(Settings(max_header_bytes=4096, max_connections=8, header_timeout_s=60.0)) as url:
        async with _connection(url) as (reader, writer):
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"y" * 8192 + b"\r\n\r\n")
            assert (await _answer(reader)).status == 431
            assert await _closed_by_server(reader)
        async with contextlib.AsyncExitStack() as stack:
            for _ in range(8):  # idle connections up to the cap
                await stack.enter_async_context(_connection(url))
            async with _connection(url) as (reader, writer):
                writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                assert (await _answer(reader)).status == 503
        async with httpx.AsyncClient(base_url=url, timeout=WAIT_S) as client:
            assert (await client.get("/health")).status_code == 200  # under the cap again


async def test_a_request_after_a_discarded_body_is_served_whole(serve: Serve, long_run: Any) -> None:
    """A body that arrives after its answer is discarded; the request behind it on the connection is then
    served however long it takes: the idle timer armed at the end of the discarded body must not run
    through it (here a run of one long turn against a keep-alive of 0.5 s)."""
    # one token per decode forward: drafts can write the random model's loops 8 tokens a forward, and the
    # turn must outlast the keep-alive
    with serve(Settings(keep_alive_s=0.5, speculative_tokens=0)) as url:
        body = json.dumps(long_run(reasoning_budget=2048, max_turns=1)).encode()
        async with _connection(url) as (reader, writer):
            writer.write(b"POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
            assert (await _answer(reader)).status == 405  # answered before its body
            writer.write(b" " * 1000 + request_head("/v1/agent/runs", len(body)) + body)
            done = await _answer(reader)
            assert done.status == 200 and json.loads(done.body)["turns"], done.body[:300]

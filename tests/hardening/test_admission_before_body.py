"""Admission before the body: a run, selection step or chat turn gets its slot, or its 429, from its
headers, before any of its body is read or parsed. Real sockets against a real server on 127.0.0.1
(tests/conftest.py's ``live_server``: the uvicorn config `ssr-server serve` uses).

The server is filled, where a test needs it full, by a request admitted from its headers that sent
``Expect: 100-continue`` and holds its body back: full for as long as the test wants, at no CPU cost,
and its run still completes once the test sends the body.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest

from ssr_server.bench.raw_http import RawResponse, read_response, request_head
from ssr_server.core.config import Settings

RUN = json.dumps({"question": "What is this?", "max_turns": 1}).encode()  # a short ssr run
SELECT = json.dumps({"messages": [{"role": "user", "content": "What is this?"}]}).encode()
PATHS = ("/v1/agent/runs", "/v1/ssr/select", "/v1/chat/completions")
WAIT_S = 30.0  # the most any answer here may take (a bound, not a timing)

Serve = Callable[[Settings], AbstractContextManager[str]]


@pytest.fixture(scope="module")
def serve(request: pytest.FixtureRequest, torch_engine: Any, demo_tools: Any) -> Serve:
    path = Path(__file__).resolve().parent.parent / "conftest.py"
    top = next(p for p in request.config.pluginmanager.get_plugins()
               if Path(getattr(p, "__file__", "") or "/").resolve() == path)
    return lambda settings: top.live_server(settings, torch_engine, demo_tools)  # type: ignore[no-any-return]


def _chat(url: str) -> bytes:
    model = httpx.get(f"{url}/v1/models", timeout=WAIT_S).json()["data"][0]["id"]
    return json.dumps({"model": model, "messages": [{"role": "user", "content": "What is this?"}]}).encode()


def _hostport(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


@contextlib.asynccontextmanager
async def _connection(url: str, sndbuf: int | None = None
                      ) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    sock = socket.socket()
    if sndbuf is not None:  # a small send buffer: the kernel takes little that the server did not read
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, _hostport(url))
    reader, writer = await asyncio.open_connection(sock=sock)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def _answer(reader: asyncio.StreamReader) -> RawResponse:
    return await asyncio.wait_for(read_response(reader), WAIT_S)


async def _ready(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=WAIT_S) as client:
        body: dict[str, Any] = (await client.get(f"{url}/ready")).json()
        return body


async def _until(url: str, **want: int) -> dict[str, Any]:
    async with asyncio.timeout(WAIT_S):
        while True:
            ready = await _ready(url)
            if all(ready[k] == v for k, v in want.items()):
                return ready
            await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def _held_slot(url: str, body: bytes = RUN) -> AsyncIterator[Callable[[], Any]]:
    """A run admitted from its headers whose body waits: yields ``finish()`` (send the body; its answer)."""
    async with _connection(url) as (reader, writer):
        writer.write(request_head("/v1/agent/runs", len(body), expect=True))
        first = await _answer(reader)
        assert first.status == 100, (first.status, first.body[:300])

        async def finish() -> RawResponse:
            writer.write(body)
            return await _answer(reader)

        yield finish


def _overloaded(r: RawResponse, path: str) -> None:
    assert r.status == 429, (path, r.status, r.body[:300])
    assert r.headers.get("retry-after", "").isdigit(), r.headers
    assert json.loads(r.body)["error"]["code"] == "overloaded", r.body[:300]


@pytest.fixture(scope="module")
def one_slot(serve: Serve) -> Iterator[str]:
    with serve(Settings(max_concurrent_runs=1, max_queued_runs=0, body_timeout_s=120)) as url:
        yield url


async def test_expect_continue_gets_its_429_without_sending_the_body(one_slot: str) -> None:
    """A client that sends Expect: 100-continue to a full server gets its 429 and no 100 Continue: it
    never sends its 8 MB, on any admitted route."""
    async with _held_slot(one_slot) as finish:
        for path in PATHS:
            async with _connection(one_slot) as (reader, writer):
                writer.write(request_head(path, 8 * 1024 * 1024, expect=True))
                _overloaded(await _answer(reader), path)
        ready = await _ready(one_slot)
        assert (ready["runs_in_flight"], ready["runs_queued"]) == (1, 0), ready
        done = await finish()  # the admitted run still completes
        assert done.status == 200 and json.loads(done.body)["turns"], done.body[:300]
    await _until(one_slot, runs_in_flight=0)


async def test_full_server_answers_a_plain_client_429_and_keeps_the_connection(one_slot: str) -> None:
    """A plain client (httpx, over h11) writes its whole 8 MB body before it reads: it gets the 429, not a
    connection error, on every route. The server discards the body as it streams and the connection
    stays usable: a request pipelined behind the body is answered on the same socket."""
    big = b'{"question": "x", "images": ["' + b"A" * (8 * 1024 * 1024) + b'"]}'
    async with _held_slot(one_slot) as finish:
        async with httpx.AsyncClient(base_url=one_slot, timeout=WAIT_S) as client:
            for path in PATHS:
                r = await client.post(path, content=big, headers={"content-type": "application/json"})
                assert r.status_code == 429 and r.headers.get("retry-after"), (path, r.status_code)
                assert r.json()["error"]["code"] == "overloaded"
            assert (await client.get("/health")).status_code == 200  # the pool's connection works
        async with _connection(one_slot) as (reader, writer):
            writer.write(request_head("/v1/agent/runs", len(big)) + big
                         + b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            _overloaded(await _answer(reader), "/v1/agent/runs")
            after = await _answer(reader)
            assert after.status == 200 and json.loads(after.body)["status"] == "ok", after
        assert (await finish()).status == 200
    await _until(one_slot, runs_in_flight=0)


async def test_idle_one_slot_burst_admits_exactly_one(one_slot: str, long_run: Any) -> None:
    """An idle server with one slot and no queue, sent a burst at once: one request is admitted, every
    other is refused from its headers. With Expect, exactly one client is asked for its body (100
    Continue) and the refused ones never send theirs; plain clients all send, and all but one get 429."""
    n = 20
    await _until(one_slot, runs_in_flight=0)
    async with contextlib.AsyncExitStack() as stack:
        conns = [await stack.enter_async_context(_connection(one_slot)) for _ in range(n)]
        for _, writer in conns:
            writer.write(request_head("/v1/agent/runs", len(RUN), expect=True))
        firsts = await asyncio.gather(*(_answer(reader) for reader, _ in conns))
        statuses = sorted(r.status for r in firsts)
        assert statuses == [100] + [429] * (n - 1), statuses
        (reader, writer), = [c for c, r in zip(conns, firsts, strict=True) if r.status == 100]
        writer.write(RUN)
        assert (await _answer(reader)).status == 200
    await _until(one_slot, runs_in_flight=0)

    # plain clients: the admitted run (one long turn) outlasts the burst's refusals
    body = json.dumps(long_run(reasoning_budget=2048, max_turns=1)).encode()
    async with contextlib.AsyncExitStack() as stack:
        conns = [await stack.enter_async_context(_connection(one_slot)) for _ in range(n)]
        for _, writer in conns:
            writer.write(request_head("/v1/agent/runs", len(body)) + body)
        answers = await asyncio.gather(*(_answer(reader) for reader, _ in conns))
    statuses = sorted(r.status for r in answers)
    assert statuses == [200] + [429] * (n - 1), statuses
    await _until(one_slot, runs_in_flight=0)


async def test_after_admission_every_refusal_gives_the_slot_back(one_slot: str) -> None:
    """The gate took the slot from the headers; a body that then fails to parse or validate, or names an
    unknown library or model, is answered as before and the slot comes back."""
    chat = json.loads(_chat(one_slot))
    bad = [
        ("/v1/agent/runs", b"{not json", 400),
        ("/v1/agent/runs", json.dumps({"question": 5}).encode(), 422),
        ("/v1/agent/runs", json.dumps({"question": "x", "library": "nope"}).encode(), 404),
        ("/v1/ssr/select", json.dumps({**json.loads(SELECT), "library": "nope"}).encode(), 404),
        ("/v1/chat/completions", json.dumps({**chat, "model": "nope"}).encode(), 404),
        ("/v1/chat/completions", json.dumps({"messages": "x"}).encode(), 400),
    ]
    async with httpx.AsyncClient(base_url=one_slot, timeout=WAIT_S) as client:
        for path, body, status in bad:
            r = await client.post(path, content=body, headers={"content-type": "application/json"})
            assert r.status_code == status, (path, r.status_code, r.text[:300])
            ready = (await client.get("/ready")).json()
            assert ready["runs_in_flight"] == 0, (path, ready)
        for path, body in zip(PATHS, (RUN, SELECT, _chat(one_slot)), strict=True):
            r = await client.post(path, content=body, headers={"content-type": "application/json"})
            assert r.status_code == 200, (path, r.status_code, r.text[:300])


async def test_queued_request_waits_for_its_slot_without_its_body_read(serve: Serve) -> None:
    """With a queue, a request that must wait is queued from its headers and its body is not read while
    it waits: an Expect client is not asked for it (no 100 Continue), and a plain client's 8 MB stop at
    what the kernel buffers hold. Once the slot is free, both bodies are read and both runs complete."""
    size = 8 * 1024 * 1024
    padded = RUN + b" " * (size - len(RUN))  # a valid run: JSON allows trailing whitespace
    settings = Settings(max_concurrent_runs=1, max_queued_runs=2, body_timeout_s=120)
    with serve(settings) as url:
        async with _held_slot(url) as finish, _connection(url) as (e_reader, e_writer), \
                _connection(url, sndbuf=65536) as (p_reader, p_writer):
            e_writer.write(request_head("/v1/agent/runs", len(RUN), expect=True))
            await _until(url, runs_queued=1)
            p_writer.write(request_head("/v1/agent/runs", size) + padded)
            await _until(url, runs_queued=2)
            # the plain client's body stays in its own buffer: the server stopped reading
            unsent = []
            for _ in range(3):
                await asyncio.sleep(0.3)
                unsent.append(p_writer.transport.get_write_buffer_size())
            assert min(unsent) > size - 4 * 1024 * 1024, (size, unsent)
            with pytest.raises(TimeoutError):  # and nothing asked the Expect client for its body
                await asyncio.wait_for(read_response(e_reader), 0.5)

            assert (await finish()).status == 200  # the slot frees: the queue moves on
            first = await _answer(e_reader)
            assert first.status == 100, first
            e_writer.write(RUN)
            assert (await _answer(e_reader)).status == 200
            assert (await _answer(p_reader)).status == 200
        await _until(url, runs_in_flight=0, runs_queued=0)


async def test_client_gone_while_queued_frees_its_place_without_a_body(serve: Serve) -> None:
    """A queued client that sent only headers and leaves gives its place back at once: the server
    notices the connection closing without reading from it."""
    with serve(Settings(max_concurrent_runs=1, max_queued_runs=1, body_timeout_s=120)) as url:
        async with _held_slot(url) as finish:
            async with _connection(url) as (_, writer):
                writer.write(request_head("/v1/agent/runs", len(RUN), expect=True))
                await _until(url, runs_queued=1)
            await _until(url, runs_queued=0)  # closed: its place is back
            async with _connection(url) as (reader, writer):  # so another may queue (not 429)
                writer.write(request_head("/v1/agent/runs", len(RUN)) + RUN)
                await _until(url, runs_queued=1)
                assert (await finish()).status == 200
                assert (await _answer(reader)).status == 200
        await _until(url, runs_in_flight=0, runs_queued=0)


async def test_the_drain_deadline_ends_a_request_whose_body_is_still_coming(torch_engine: Any,
                                                                           demo_tools: Any) -> None:
    """Between the gate's admission and the route taking the slot (the body being read), the shutdown
    drain's deadline ends the request as it ends admitted work: a JSON 503, and the slot back."""
    from ssr_server.api.app import create_app

    settings = Settings(max_concurrent_runs=1, max_queued_runs=0)
    app = create_app(settings, engine=torch_engine, tools=demo_tools)
    async with app.router.lifespan_context(app):
        adm = app.state.ssr.admission
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            await asyncio.Event().wait()  # the body never comes
            raise AssertionError("unreachable")

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/v1/agent/runs", "raw_path": b"/v1/agent/runs", "root_path": "",
                 "query_string": b"", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80), "state": {},
                 "headers": [(b"content-type", b"application/json"), (b"content-length", b"100")]}
        request = asyncio.create_task(app(scope, receive, send))
        async with asyncio.timeout(WAIT_S):
            while adm.running != 1:  # noqa: ASYNC110  (a counter, no event to wait on)
                await asyncio.sleep(0.01)
        assert not await adm.drain(0.05)
        assert adm.expire() == 1
        await asyncio.wait_for(request, WAIT_S)
        assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 503, sent[:1]
        body = json.loads(b"".join(m.get("body", b"") for m in sent[1:]))
        assert body["error"]["code"] == "shutting_down", body
        assert (adm.running, adm.queued) == (0, 0)

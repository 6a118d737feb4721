"""A raw HTTP/1.1 client, one request per connection: what the admission bench and the slow-client
tests need and httpx hides (when the body is sent, ``Expect: 100-continue``, an interim 100 answer)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes


def request_head(path: str, length: int, *, expect: bool = False, host: str = "127.0.0.1",
                 extra: tuple[tuple[str, str], ...] = ()) -> bytes:
    """The line and headers of a JSON POST of ``length`` bytes."""
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", "Content-Type: application/json",
             f"Content-Length: {length}"]
    lines += ["Expect: 100-continue"] if expect else []
    lines += [f"{k}: {v}" for k, v in extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def read_response(reader: asyncio.StreamReader) -> RawResponse:
    """One HTTP/1.1 response (an interim 1xx one included) off ``reader``; raises on a closed connection."""
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("the connection closed before an answer")
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if status < 200 or status in (204, 304):
        return RawResponse(status, headers, b"")
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while size := int((await reader.readline()).split(b";")[0], 16):
            body += (await reader.readexactly(size + 2))[:-2]
        await reader.readline()
        return RawResponse(status, headers, body)
    return RawResponse(status, headers, await reader.readexactly(int(headers.get("content-length", "0"))))

"""Image intake (``ssr_server.core.images.intake``): base64 and data URLs, format and pixel limits, bombs,
and SSRF-safe URL fetching against a real local HTTP server (127.0.0.1 only).

Addresses that must be refused are refused at check time: the tests hand the fetcher an HTTP client
whose transport fails the test if it is ever asked to send anything.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import ipaddress
import socket
import threading
import time
import urllib.parse
import zlib
from collections.abc import AsyncIterator, Iterator
from typing import Any
from unittest import mock

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, RedirectResponse, Response, StreamingResponse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageFile

from ssr_server.core.errors import InvalidImage, InvalidRequest, PayloadTooLarge
from ssr_server.core.images.intake import (
    ALLOWED_FORMATS,
    ImageLimits,
    decode_base64,
    decode_image_bytes,
    fetch_url,
    load_image,
)
from ssr_server.core.protocol import ImageRef
from ssr_server.tools.demo import demo_picture, shipped_demo_world

PRIVATE = ImageLimits(allow_private=True, timeout_s=5.0)
PUBLIC_ONLY = ImageLimits(allow_private=False, timeout_s=5.0)


def png_bytes(size: tuple[int, int] | None = None) -> bytes:
    img = demo_picture(shipped_demo_world().entity_ids()[0])
    if size is not None:
        img = img.resize(size)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def huge_png(width: int, height: int) -> bytes:
    """A valid 1-bit PNG of any size, built row by row: tens of KB for hundreds of megapixels."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")

    ihdr = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([1, 0, 0, 0, 0])
    comp = zlib.compressobj(9)
    row = b"\x00" * (1 + (width + 7) // 8)
    idat = b"".join(comp.compress(row) for _ in range(height)) + comp.flush()
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


PNG = png_bytes()


# ---- base64 and data URLs ----------------------------------------------------------------------------
async def test_raw_base64_and_data_url_decode_to_the_same_image() -> None:
    want = ImageRef.from_pil(Image.open(io.BytesIO(PNG)))
    raw = base64.b64encode(PNG).decode()
    for spec in (raw, f"  {raw}\n", "data:image/png;base64," + raw, "DATA:IMAGE/PNG;BASE64," + raw,
                 "data:image/webp;base64," + raw):  # the declared type is not trusted: the bytes decide
        ref = await load_image(spec, ImageLimits())
        assert ref.digest == want.digest
        assert ref.image.mode == "RGB" and ref.image.size == want.image.size


@pytest.mark.parametrize("spec", ["not base64!", "aGVsbG8", "data:image/png;base64,***",
                                  "data:text/plain;base64,aGVsbG8=", base64.b64encode(b"hello").decode()])
async def test_bad_base64_or_not_an_image(spec: str) -> None:
    with pytest.raises(InvalidImage):
        await load_image(spec, ImageLimits())


def test_base64_over_the_byte_limit_is_refused_before_decoding() -> None:
    limits = ImageLimits(max_bytes=1000)
    with pytest.raises(PayloadTooLarge):
        decode_base64("A" * 2000, limits)
    with pytest.raises(PayloadTooLarge):
        decode_image_bytes(PNG, ImageLimits(max_bytes=len(PNG) - 1))
    assert decode_image_bytes(PNG, ImageLimits(max_bytes=len(PNG))).image.size == (224, 160)


@pytest.mark.parametrize("scheme", ["file:///etc/passwd", "ftp://example.com/a.png", "gopher://x/1",
                                    "FILE:///etc/hosts", "javascript://alert(1)"])
async def test_other_schemes_are_refused(scheme: str) -> None:
    with pytest.raises(InvalidImage, match="scheme"):
        await load_image(scheme, ImageLimits(allow_private=True))


# ---- formats, pixels and bombs ---------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", sorted(ALLOWED_FORMATS))
def test_allowed_formats_decode(fmt: str) -> None:
    buf = io.BytesIO()
    demo_picture(shipped_demo_world().entity_ids()[0]).save(buf, format=fmt)
    ref = decode_image_bytes(buf.getvalue(), ImageLimits())
    assert ref.image.mode == "RGB" and ref.image.size == (224, 160)


@pytest.mark.parametrize("fmt", ["TIFF", "ICO", "PPM", "PCX", "TGA"])
def test_other_formats_are_refused(fmt: str) -> None:
    buf = io.BytesIO()
    demo_picture(shipped_demo_world().entity_ids()[0]).resize((64, 64)).save(buf, format=fmt)
    with pytest.raises(InvalidImage, match="format"):
        decode_image_bytes(buf.getvalue(), ImageLimits())


def test_pixel_limit() -> None:
    with pytest.raises(PayloadTooLarge, match="pixels"):
        decode_image_bytes(png_bytes((100, 100)), ImageLimits(max_pixels=9999))
    assert decode_image_bytes(png_bytes((100, 100)), ImageLimits(max_pixels=10000)).image.size == (100, 100)


@pytest.mark.parametrize(("size", "max_pixels"), [
    ((5000, 5000), 16_000_000),  # over our limit only
    ((10000, 10000), 16_000_000), ((10000, 10000), 10**12),  # over Pillow's warning threshold (~89 MP)
    ((20000, 20000), 16_000_000), ((20000, 20000), 10**12),  # over its error threshold (~179 MP)
    ((65535, 65535), 16_000_000), ((65535, 65535), 10**12),
])
def test_decompression_bombs_are_payload_too_large(size: tuple[int, int], max_pixels: int) -> None:
    """Whether our pixel limit or Pillow's bomb guard catches it (a deployment may raise our limit
    above Pillow's): always a 413, never an unhandled error, never decoded (25 MB to 4 GB each)."""
    data = huge_png(*size) if size[0] <= 20000 else _header_only_png(*size)
    assert len(data) < 1_000_000
    # refused from the header: decoding the pixels (ImageFile.load) would fail the test
    with mock.patch.object(ImageFile.ImageFile, "load", side_effect=AssertionError("decoded")), \
            pytest.raises(PayloadTooLarge):
        decode_image_bytes(data, ImageLimits(max_pixels=max_pixels))


def _header_only_png(width: int, height: int) -> bytes:
    full = huge_png(1, 1)
    ihdr = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([1, 0, 0, 0, 0])
    chunk = len(ihdr).to_bytes(4, "big") + b"IHDR" + ihdr + zlib.crc32(b"IHDR" + ihdr).to_bytes(4, "big")
    return full[:8] + chunk + full[8 + 25:]


def test_gif_with_a_huge_screen_is_refused_cleanly() -> None:
    buf = io.BytesIO()
    Image.new("P", (8, 8)).save(buf, format="GIF")
    data = bytearray(buf.getvalue())
    data[6:10] = (65535).to_bytes(2, "little") * 2  # logical screen 65535 x 65535
    with pytest.raises(InvalidRequest) as info:
        decode_image_bytes(bytes(data), ImageLimits())
    assert info.value.status_code in (400, 413)


@pytest.mark.parametrize("cut", [0.3, 0.6, 0.95])
def test_truncated_images_are_invalid(cut: float) -> None:
    with pytest.raises(InvalidImage):
        decode_image_bytes(PNG[: int(len(PNG) * cut)], ImageLimits())


def test_extreme_aspect_ratio_is_refused() -> None:
    buf = io.BytesIO()
    Image.new("RGB", (1010, 10)).save(buf, format="PNG")
    with pytest.raises(InvalidImage, match="aspect"):
        decode_image_bytes(buf.getvalue(), ImageLimits())


# ---- URL checks before any connection ------------------------------------------------------------------
def never_called() -> tuple[httpx.AsyncClient, list[httpx.Request]]:
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        raise AssertionError(f"a refused URL was contacted: {request.url}")

    return httpx.AsyncClient(transport=httpx.MockTransport(handler)), sent


REFUSED = [
    "http://127.0.0.1/a.png", "http://127.0.0.1:8000/a.png", "http://localhost/a.png", "http://LOCALHOST:80/",
    "http://[::1]/a.png", "http://10.0.0.1/a.png", "http://172.16.0.1/", "http://192.168.1.1/",
    "http://169.254.169.254/latest/meta-data/", "http://0.0.0.0/", "http://224.0.0.1/", "http://240.0.0.1/",
    "http://100.64.0.1/", "http://[fe80::1]/", "http://[fc00::1]/", "http://[::ffff:127.0.0.1]/",
    "http://[::ffff:a9fe:a9fe]/", "http://127.1/", "http://2130706433/", "http://0x7f000001/",
    "https://127.0.0.1/a.png", "http://[::]/",
]


@pytest.mark.parametrize("url", REFUSED)
async def test_non_public_addresses_are_refused_before_connecting(url: str) -> None:
    client, sent = never_called()
    async with client:
        with pytest.raises(InvalidImage) as info:
            await fetch_url(url, PUBLIC_ONLY, client)
        with pytest.raises(InvalidImage):
            await load_image(url, PUBLIC_ONLY, client)
    assert sent == []
    assert "non-public" in info.value.message or "does not resolve" in info.value.message


@pytest.mark.parametrize("url", [
    "http://[64:ff9b::a9fe:a9fe]/latest/meta-data/",  # NAT64 well-known prefix + 169.254.169.254
    "http://[64:ff9b::7f00:1]/",  # NAT64 + 127.0.0.1
    "http://[2002:a9fe:a9fe::]/",  # 6to4 + 169.254.169.254
])
async def test_private_ipv4_inside_ipv6_translation_prefixes_is_refused(url: str) -> None:
    """Where NAT64 or a 6to4 relay routes them, these reach the embedded IPv4 address. NAT64's prefix
    is refused already (it lies in ::/8, which ``is_reserved`` covers); 6to4 (2002::/16) is global
    unicast to Python, so the check must unwrap ``ip.sixtofour`` like it unwraps IPv4-mapped ones."""
    client, sent = never_called()
    async with client:
        with pytest.raises(InvalidImage, match="non-public"):
            await fetch_url(url, PUBLIC_ONLY, client)
    assert sent == []


MALFORMED = [
    "http://user:pw@8.8.8.8/a.png", "http:///a.png", "http://:80/a.png",
    # ports out of range or not numbers, broken IPv6 literals (a 500 from urlsplit().port once)
    "http://1.1.1.1:99999/x.png", "http://[::1/", "http://example.com:abc/x.png", "https://example.com:-1/",
    "http://example.com:0/", "http://example.com:65536/", "http://[v1.x]/", "http://[::1]]/",
    # hosts that are no DNS name: not looked up at all
    "http://xn--/", "http://a..b/", "http://" + "a" * 64 + ".com/", "http://" + "a." * 130 + "com/",
    "http://exa mple.com/", "http://-a.com/", "http://a%00b.com/", "http://x.127.0.0.1/", "http://1.2.3.4.5/",
    "http://256.1.1.1/", "http://a_b.99/",
    # characters httpx cannot encode
    "http://a/\udcff", "http://a\x00b/", "http://\u0000/",
]


@pytest.mark.parametrize("url", MALFORMED)
async def test_malformed_urls_are_refused_before_connecting(url: str) -> None:
    client, sent = never_called()
    async with client:
        for limits in (ImageLimits(allow_private=True), PUBLIC_ONLY):
            with pytest.raises(InvalidImage) as info:
                await fetch_url(url, limits, client)
            assert_no_internals(info.value.message)
            with pytest.raises(InvalidImage):
                await load_image(url, limits, client)
    assert sent == []


@pytest.mark.parametrize("host", ["127.1", "2130706433", "0x7f000001", "0x7f.1", "127.0.0.1."])
async def test_numeric_host_forms_are_addresses_never_names(host: str) -> None:
    """A host ending in a number is read as an IPv4 address (the resolver would do the same), so it is
    vetted as one and never sent to DNS."""
    client, sent = never_called()
    async with client:
        with pytest.raises(InvalidImage, match="non-public"):
            await fetch_url(f"http://{host}/a.png", PUBLIC_ONLY, client)
    assert sent == []


async def test_allowlist_is_checked_before_resolution() -> None:
    client, sent = never_called()
    limits = ImageLimits(allow_private=True, allowlist=("images.example.org",))
    async with client:
        for url in ("http://8.8.8.8/a.png", "http://evil-images.example.org/a.png",
                    "http://images.example.org.evil.test/a.png"):
            with pytest.raises(InvalidImage, match="allow-list"):
                await fetch_url(url, limits, client)
    assert sent == []


async def test_each_redirect_hop_is_checked_again() -> None:
    """A public address that redirects to a private one: the second hop is refused, not contacted."""
    sent: list[httpx.Request] = []
    targets = iter(["http://169.254.169.254/latest/meta-data/", "http://127.0.0.1:8080/admin",
                    "file:///etc/passwd", "http://[::1]/x"])

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(302, headers={"location": next(targets)})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        for _ in range(4):
            with pytest.raises(InvalidImage):
                await fetch_url("http://93.184.216.34/start.png", PUBLIC_ONLY, client)
    assert len(sent) == 4  # only the public first hops went out
    for req in sent:
        assert req.url.host == "93.184.216.34" and req.url.path == "/start.png"
        assert req.headers["host"] == "93.184.216.34"


@pytest.mark.parametrize("location", [
    "http://1.1.1.1:99999/x.png", "http://[::1/", "http://example.com:abc/x.png", "https://example.com:-1/",
    "http://a..b/", "//[::1/x",
])
async def test_a_redirect_to_a_malformed_url_is_invalid(location: str) -> None:
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(302, headers={"location": location})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(InvalidImage) as info:
            await fetch_url("http://93.184.216.34/start.png", PUBLIC_ONLY, client)
    assert_no_internals(info.value.message)
    assert len(sent) == 1  # the first hop only


def assert_no_internals(message: str) -> None:
    assert " at 0x" not in message and "<_io." not in message and "object at" not in message, message


# ---- a real local server -------------------------------------------------------------------------------
BIG = 64 * 1024


def make_app() -> FastAPI:
    app = FastAPI()
    seen: list[tuple[str, str]] = []
    app.state.seen = seen

    @app.middleware("http")
    async def record(request: Request, call_next: Any) -> Response:
        seen.append((request.url.path, request.headers.get("host", "")))
        response: Response = await call_next(request)
        return response

    @app.get("/img.png")
    async def img() -> Response:
        return Response(PNG, media_type="image/png")

    @app.get("/bomb.png")
    async def bomb() -> Response:
        return Response(huge_png(20000, 20000), media_type="image/png")

    @app.get("/text")
    async def text() -> Response:
        return PlainTextResponse("this is not an image")

    @app.get("/redirect")
    async def redirect(to: str, code: int = 302) -> Response:
        return RedirectResponse(to, status_code=code)

    @app.get("/no-location")
    async def no_location() -> Response:
        return Response(status_code=302)

    @app.get("/loop")
    async def loop() -> Response:
        return RedirectResponse("/loop", status_code=302)

    @app.get("/chain/{n}")
    async def chain(n: int) -> Response:
        if n == 0:
            return Response(PNG, media_type="image/png")
        return RedirectResponse(f"/chain/{n - 1}", status_code=307)

    @app.get("/stream-big")
    async def stream_big() -> Response:
        async def body() -> AsyncIterator[bytes]:
            for _ in range(16):
                yield b"\x00" * (BIG // 4)
        return StreamingResponse(body(), media_type="image/png")  # chunked: no Content-Length

    @app.get("/declared-big")
    async def declared_big() -> Response:
        return Response(b"\x00" * (BIG * 2), media_type="image/png")

    @app.get("/status/{code}")
    async def status(code: int) -> Response:
        return PlainTextResponse("nope", status_code=code)

    async def wait_or_gone(request: Request, seconds: float) -> None:
        async def gone() -> None:
            while not await request.is_disconnected():  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(gone(), seconds)

    @app.get("/slow")
    async def slow(request: Request) -> Response:
        await wait_or_gone(request, 3.0)
        return Response(PNG, media_type="image/png")

    @app.get("/drip")
    async def drip() -> Response:
        async def body() -> AsyncIterator[bytes]:
            for i in range(0, len(PNG), 64):
                await asyncio.sleep(0.05)
                yield PNG[i:i + 64]
        return StreamingResponse(body(), media_type="image/png")

    return app


@pytest.fixture(scope="module")
def img_server() -> Iterator[tuple[str, list[tuple[str, str]]]]:
    app = make_app()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off",
                                           timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the image server did not start")
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}", app.state.seen
    server.should_exit = True
    thread.join(timeout=5)
    sock.close()


@pytest.fixture()
def server(img_server: tuple[str, list[tuple[str, str]]]) -> tuple[str, list[tuple[str, str]]]:
    url, seen = img_server
    seen.clear()
    return url, seen


async def test_fetches_a_png_when_private_addresses_are_allowed(server: tuple[str, list[Any]]) -> None:
    url, seen = server
    assert await fetch_url(url + "/img.png", PRIVATE) == PNG
    ref = await load_image(url + "/img.png", PRIVATE)
    assert ref.digest == ImageRef.from_pil(Image.open(io.BytesIO(PNG))).digest
    port = url.rsplit(":", 1)[1]
    # by name: resolved, connected to the checked address, Host header kept
    assert await fetch_url(f"http://localhost:{port}/img.png", PRIVATE) == PNG
    assert seen == [("/img.png", f"127.0.0.1:{port}")] * 2 + [("/img.png", f"localhost:{port}")]


async def test_the_same_server_is_refused_without_allow_private(server: tuple[str, list[Any]]) -> None:
    url, seen = server
    with pytest.raises(InvalidImage, match="non-public"):
        await fetch_url(url + "/img.png", PUBLIC_ONLY)
    port = url.rsplit(":", 1)[1]
    with pytest.raises(InvalidImage, match="non-public"):
        await load_image(f"http://localhost:{port}/img.png", PUBLIC_ONLY)
    assert seen == []  # never contacted


async def test_redirects_are_followed_by_hand(server: tuple[str, list[Any]]) -> None:
    url, seen = server
    for code in (301, 302, 303, 307, 308):
        assert await fetch_url(f"{url}/redirect?to=/img.png&code={code}", PRIVATE) == PNG
    assert await fetch_url(f"{url}/redirect?to={url}/img.png", PRIVATE) == PNG  # absolute Location
    limits = ImageLimits(allow_private=True, max_redirects=3)
    assert await fetch_url(f"{url}/chain/3", limits) == PNG
    seen.clear()
    with pytest.raises(InvalidImage, match="redirected more than 3"):
        await fetch_url(f"{url}/chain/4", limits)
    assert [p for p, _ in seen] == ["/chain/4", "/chain/3", "/chain/2", "/chain/1"]


async def test_redirect_loop_is_refused(server: tuple[str, list[Any]]) -> None:
    url, seen = server
    with pytest.raises(InvalidImage, match="redirected more than 2"):
        await fetch_url(url + "/loop", ImageLimits(allow_private=True, max_redirects=2))
    assert [p for p, _ in seen] == ["/loop"] * 3
    seen.clear()
    with pytest.raises(InvalidImage):
        await fetch_url(url + "/loop", ImageLimits(allow_private=True, max_redirects=0))
    assert [p for p, _ in seen] == ["/loop"]


async def test_redirect_off_the_allowlist_is_refused(server: tuple[str, list[Any]]) -> None:
    url, seen = server
    port = url.rsplit(":", 1)[1]
    limits = ImageLimits(allow_private=True, allowlist=("localhost",))
    start = f"http://localhost:{port}"
    assert await fetch_url(f"{start}/redirect?to=/img.png", limits) == PNG  # same host: fine
    seen.clear()
    with pytest.raises(InvalidImage, match="allow-list"):
        await fetch_url(f"{start}/redirect?to=http://127.0.0.1:{port}/img.png", limits)
    assert [p for p, _ in seen] == ["/redirect"]  # the off-list target was never contacted


async def test_redirect_to_another_scheme_is_refused(server: tuple[str, list[Any]]) -> None:
    url, _ = server
    with pytest.raises(InvalidImage, match="scheme"):
        await fetch_url(f"{url}/redirect?to=file:///etc/passwd", PRIVATE)
    with pytest.raises(InvalidImage, match="Location"):
        await fetch_url(f"{url}/no-location", PRIVATE)


async def test_oversized_bodies(server: tuple[str, list[Any]]) -> None:
    url, _ = server
    limits = ImageLimits(allow_private=True, max_bytes=BIG)
    with pytest.raises(PayloadTooLarge):
        await fetch_url(url + "/stream-big", limits)  # streamed, no Content-Length
    with pytest.raises(PayloadTooLarge):
        await fetch_url(url + "/declared-big", limits)  # declared
    with pytest.raises(PayloadTooLarge):
        await load_image(url + "/bomb.png", PRIVATE)  # small file, huge picture


async def test_slow_servers_time_out(server: tuple[str, list[Any]]) -> None:
    url, _ = server
    limits = ImageLimits(allow_private=True, timeout_s=0.3)
    for path in ("/slow", "/drip"):  # no answer; an answer trickling in under any per-read timeout
        # "longer than" is only said by the whole-fetch deadline (a read timeout would say "failed")
        with pytest.raises(InvalidImage, match="longer than"):
            await fetch_url(url + path, limits)


@pytest.mark.parametrize("code", [204, 404, 403, 500, 503])
async def test_non_200_is_invalid(server: tuple[str, list[Any]], code: int) -> None:
    url, _ = server
    with pytest.raises(InvalidImage, match=f"HTTP {code}"):
        await fetch_url(f"{url}/status/{code}", PRIVATE)


async def test_a_non_image_body_is_invalid(server: tuple[str, list[Any]]) -> None:
    url, _ = server
    with pytest.raises(InvalidImage, match="not recognised") as info:
        await load_image(url + "/text", PRIVATE)
    assert_no_internals(info.value.message)


async def test_a_closed_port_is_an_invalid_image_not_a_crash() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(InvalidImage, match="failed"):
        await fetch_url(f"http://127.0.0.1:{port}/a.png", PRIVATE)


# ---- fuzzing the URL intake (loopback only) ----------------------------------------------------------------
class LoopbackOnly(httpx.AsyncBaseTransport):
    """A real transport that connects to loopback addresses only; any other address is recorded (the
    test then fails) and not contacted. The fetcher always connects to the address it vetted, so the
    request's host here is that address."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport(retries=0)
        self.escaped: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            loopback = ipaddress.ip_address(request.url.host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            self.escaped.append(str(request.url))
            raise httpx.ConnectError("not loopback: refused by the test transport", request=request)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


# Only IP literals of loopback pass the allow-list: every other host is refused before any lookup, and
# names ending in a number (x.127.0.0.1) are no names at all, so nothing is ever sent to DNS.
FUZZ_LIMITS = ImageLimits(allow_private=True, allowlist=("127.0.0.1", "::1"), timeout_s=2.0,
                          max_bytes=BIG, max_redirects=3)
_HOSTS = st.one_of(
    st.sampled_from(["127.0.0.1", "[::1]", "127.1", "[::1", "::1]", "[v1.x]", "1.1.1.1", "example.com",
                     "", "0x7f.1", "%31%32%37.0.0.1", "xn--", "a..b", "ünï.com", "[fe80::1%25eth0]",
                     "x.127.0.0.1", "127.0.0.1.", "LOCALHOST", "[::ffff:127.0.0.1]", "user@127.0.0.1",
                     "127.0.0.1\\@1.1.1.1"]),
    st.text(max_size=16),
    st.from_regex(r"[a-z0-9.\-\[\]:%@_]{0,20}", fullmatch=True),
)
_PORTS = st.one_of(st.just(""), st.just(":{port}"), st.integers(-70000, 140000).map(lambda p: f":{p}"),
                   st.text(max_size=6).map(lambda t: ":" + t))
_PATHS = st.one_of(
    st.sampled_from(["/img.png", "/text", "/bomb.png", "/chain/2", "/chain/9", "/loop", "/status/500",
                     "/no-location", "/stream-big", "/declared-big", "", "/", "?#", "/%zz"]),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=24).map(
        lambda t: "/redirect?to=" + urllib.parse.quote(t, safe="")),
    st.text(max_size=16),
)
_STRUCTURED = st.tuples(
    st.sampled_from(["http", "https", "HTTP", "hTtPs", "ftp", "file", "", "h\x00ttp"]),
    st.sampled_from(["://", ":/", ":", ":///", "://\\", "//"]),
    st.one_of(st.just(""), st.text(max_size=6).map(lambda t: t + "@")),
    _HOSTS, _PORTS, _PATHS,
).map(lambda p: "".join(p))
_SPECS = st.one_of(_STRUCTURED, st.text(max_size=40).map(lambda t: "http://" + t), st.text(max_size=40))


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(spec=_SPECS)
def test_fuzzed_urls_give_only_typed_4xx_errors(img_server: tuple[str, list[Any]], spec: str) -> None:
    """Whatever the URL (or what it redirects to), intake ends in an image or in one of our typed
    4xx errors with a clean message: never a ValueError, an httpx error or a 500; and nothing outside
    the loopback interface is ever contacted."""
    port = img_server[0].rsplit(":", 1)[1]
    spec = spec.replace("{port}", port)

    async def attempt() -> tuple[ImageRef | InvalidRequest, list[str]]:
        transport = LoopbackOnly()
        async with httpx.AsyncClient(transport=transport) as client:
            try:
                return await load_image(spec, FUZZ_LIMITS, client), transport.escaped
            except InvalidRequest as exc:
                return exc, transport.escaped

    outcome, escaped = asyncio.run(attempt())
    assert escaped == [], f"{spec!r} reached beyond loopback: {escaped}"
    if isinstance(outcome, InvalidRequest):
        assert 400 <= outcome.status_code < 500, (spec, outcome)
        assert_no_internals(outcome.message)
    else:
        assert outcome.image.mode == "RGB"


# ---- bounded decoding and what the server keeps ---------------------------------------------------------
async def test_decoding_is_bounded_by_the_decode_slots() -> None:
    """Eight images at once through two slots: never more than two decodes run together (each decode
    here waits until a third one would have started, or 1 s)."""
    lock = threading.Lock()
    state = {"active": 0, "peak": 0}
    third = threading.Event()
    real = decode_image_bytes

    def watched(data: bytes, limits: ImageLimits) -> ImageRef:
        with lock:
            state["active"] += 1
            state["peak"] = max(state["peak"], state["active"])
            if state["active"] >= 3:
                third.set()
        third.wait(1.0)
        try:
            return real(data, limits)
        finally:
            with lock:
                state["active"] -= 1

    limits = ImageLimits(decode_slots=asyncio.Semaphore(2))
    spec = base64.b64encode(PNG).decode()
    with mock.patch("ssr_server.core.images.intake.decode_image_bytes", watched):
        refs = await asyncio.wait_for(asyncio.gather(*(load_image(spec, limits) for _ in range(8))), 60)
    assert len(refs) == 8 and all(r.image.size == (224, 160) for r in refs)
    assert state["peak"] <= 2, f"{state['peak']} decodes ran at once with two slots"


async def test_a_cancelled_caller_keeps_its_slot_until_the_decode_ends() -> None:
    """The slot bounds pixels in memory: a caller that stops waiting must not free it while its thread
    still decodes."""
    started, finish = threading.Event(), threading.Event()
    real = decode_image_bytes

    def slow(data: bytes, limits: ImageLimits) -> ImageRef:
        started.set()
        finish.wait(10)
        return real(data, limits)

    slots = asyncio.Semaphore(1)
    limits = ImageLimits(decode_slots=slots)
    with mock.patch("ssr_server.core.images.intake.decode_image_bytes", slow):
        task = asyncio.create_task(load_image(base64.b64encode(PNG).decode(), limits))
        assert await asyncio.to_thread(started.wait, 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert slots.locked()  # the thread still decodes: the slot is still taken
        finish.set()
        async with asyncio.timeout(10), slots:  # freed once the thread is done
            pass


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_large_images_are_kept_downscaled(fmt: str) -> None:
    img = demo_picture(shipped_demo_world().entity_ids()[0]).resize((2400, 1600))
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    keep = 600_000
    ref = decode_image_bytes(buf.getvalue(), ImageLimits(keep_pixels=keep))
    w, h = ref.image.size
    assert w * h <= keep and w * h >= 0.95 * keep, (w, h)
    assert abs(w / h - 1.5) < 0.01 and ref.image.mode == "RGB"
    # small enough already: kept as sent, pixel for pixel
    same = decode_image_bytes(PNG, ImageLimits(keep_pixels=keep))
    assert same.digest == ImageRef.from_pil(Image.open(io.BytesIO(PNG))).digest

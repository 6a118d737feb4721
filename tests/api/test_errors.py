"""Every refusal over real HTTP: the right 4xx status and one JSON shape, never a 500."""

from __future__ import annotations

import base64
import io
import re
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from PIL import Image

from ssr_server.core.config import Settings

ErrorShape = Callable[..., dict[str, Any]]
RUNS = "/v1/agent/runs"
SELECT = "/v1/ssr/select"
USER_X = [{"role": "user", "content": "x"}]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def huge_png(width: int, height: int) -> bytes:
    """A valid 1-bit PNG of any size, built row by row: tens of KB for hundreds of megapixels."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (len(data).to_bytes(4, "big") + kind + data
                + zlib.crc32(kind + data).to_bytes(4, "big"))

    ihdr = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([1, 0, 0, 0, 0])
    comp = zlib.compressobj(9)
    row = b"\x00" * (1 + (width + 7) // 8)
    idat = b"".join(comp.compress(row) for _ in range(height)) + comp.flush()
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def select_with_image(spec: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": [{"type": "image", "image": spec},
                                                      {"type": "text", "text": "What is it?"}]}]}


# ---- the table: (method, path, json body or raw bytes, status, code) -------------------------------
CASES: list[tuple[str, str, Any, int, str | None]] = [
    # not JSON at all
    ("POST", RUNS, b"{not json", 400, "invalid_json"),
    ("POST", RUNS, b'{"question": "x",}', 400, "invalid_json"),
    ("POST", SELECT, b"\xff\xfe garbage", 400, "invalid_json"),
    # JSON syntax, but not UTF-8, or nested past what the parser can read (FastAPI: a bare 400)
    ("POST", RUNS, b'{"question": "\xff\xfe what"}', 400, "invalid_json"),
    ("POST", SELECT, b'{"messages": [{"role": "user", "content": "\xc3\x28"}]}', 400, "invalid_json"),
    ("POST", RUNS, b"[" * 100_000 + b"]" * 100_000, 400, "invalid_json"),
    ("POST", RUNS, b'{"question": "x", "images": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", 400,
     "invalid_json"),
    # schema
    ("POST", RUNS, {}, 422, "validation_error"),
    ("POST", RUNS, [], 422, "validation_error"),
    ("POST", RUNS, "just a string", 422, "validation_error"),
    ("POST", RUNS, {"question": ""}, 422, "validation_error"),
    ("POST", RUNS, {"question": "x", "unexpected": 1}, 422, "validation_error"),
    ("POST", RUNS, {"question": 5}, 422, "validation_error"),
    ("POST", RUNS, {"question": ["x"]}, 422, "validation_error"),
    ("POST", RUNS, {"question": "x", "images": "abc"}, 422, "validation_error"),
    ("POST", RUNS, {"question": "x", "images": [5]}, 422, "validation_error"),
    ("POST", RUNS, {"question": "x", "max_turns": "many"}, 422, "validation_error"),
    ("POST", RUNS, {"question": "x", "max_turns": 1.5}, 422, "validation_error"),
    ("POST", RUNS, {"question": "x", "tau": "hot"}, 422, "validation_error"),
    ("POST", RUNS, {"question": "x", "tau": -0.5}, 422, "validation_error"),
    ("POST", RUNS, {"question": "x", "tau": 1000}, 422, "validation_error"),
    ("POST", RUNS, {"question": "x", "alpha": -1}, 422, "validation_error"),
    ("POST", RUNS, {"question": "x", "seed": -1}, 422, "validation_error"),
    ("POST", RUNS, {"question": "x", "seed": 2**64}, 422, "validation_error"),
    ("POST", RUNS, {"question": "x", "mode": "beam"}, 422, "validation_error"),
    ("POST", RUNS, {"question": "x", "max_turns": 0}, 422, "validation_error"),
    ("POST", RUNS, {"question": "x", "max_turns": 33}, 422, "validation_error"),
    ("POST", RUNS, {"question": "x", "reasoning_budget": 0}, 422, "validation_error"),
    ("POST", RUNS, {"question": "x", "candidates": "abc"}, 422, "validation_error"),
    ("POST", RUNS, {"question": "x", "label_only": "maybe"}, 422, "validation_error"),
    ("POST", RUNS, b'{"question": "x", "tau": NaN}', 422, None),
    ("POST", RUNS, b'{"question": "x", "alpha": Infinity}', 422, None),
    ("POST", SELECT, {"messages": []}, 422, "validation_error"),
    ("POST", SELECT, {"messages": [{"role": "tool", "content": "x"}]}, 422, "validation_error"),
    ("POST", SELECT, {"messages": [{"role": "user", "content": [{"type": "video"}]}]}, 422,
     "validation_error"),
    ("POST", SELECT, {"messages": USER_X, "tau": -1}, 422, "validation_error"),
    ("POST", SELECT, {"messages": USER_X, "extra": True}, 422, "validation_error"),
    # well-formed but impossible
    ("POST", RUNS, {"question": "x", "max_turns": 20}, 400, "invalid_request"),  # server limit is 12
    ("POST", RUNS, {"question": "x", "library": "no-such-library"}, 404, "unknown_library"),
    ("POST", SELECT, {"messages": USER_X, "library": "nope"}, 404, "unknown_library"),
    ("POST", RUNS, {"question": "x", "candidates": []}, 400, "invalid_request"),
    ("POST", RUNS, {"question": "x", "candidates": ["a"] * 17}, 400, "invalid_request"),
    ("POST", RUNS, {"question": "x", "candidates": ["   "]}, 400, "invalid_request"),
    ("POST", RUNS, {"question": "x", "candidates": ["I will </think> now"]}, 400, "invalid_request"),
    ("POST", SELECT, {"messages": USER_X, "candidates": ["<|im_end|>"]}, 400, "invalid_request"),
    ("POST", SELECT, {"messages": [{"role": "user", "content": [{"type": "image"}]}]}, 400,
     "invalid_request"),
    ("POST", RUNS, {"question": "x" * 4001}, 413, "payload_too_large"),
    ("POST", RUNS, {"question": "x", "candidates": ["y" * 401]}, 413, "payload_too_large"),
    ("POST", SELECT, {"messages": [{"role": "user", "content": "x"}] * 65}, 413, "payload_too_large"),
    # images that are not images, or not allowed
    ("POST", RUNS, {"question": "x", "images": ["not base64 at all!"]}, 400, "invalid_image"),
    ("POST", RUNS, {"question": "x", "images": [""]}, 400, "invalid_image"),
    ("POST", RUNS, {"question": "x", "images": [b64(PNG_MAGIC + b"\x00" * 64)]}, 400, "invalid_image"),
    ("POST", RUNS, {"question": "x", "images": [b64(b"hello, this is text")]}, 400, "invalid_image"),
    ("POST", RUNS, {"question": "x", "images": ["data:image/png;base64,@@@@"]}, 400, "invalid_image"),
    ("POST", RUNS, {"question": "x", "images": ["file:///etc/passwd"]}, 400, "invalid_image"),
    ("POST", RUNS, {"question": "x", "images": ["ftp://example.com/a.png"]}, 400, "invalid_image"),
    ("POST", RUNS, {"question": "x", "images": ["http://127.0.0.1:9/a.png"]}, 400, "invalid_image"),
    ("POST", RUNS, {"question": "x", "images": ["http://169.254.169.254/latest/"]}, 400, "invalid_image"),
    ("POST", RUNS, {"question": "x", "images": ["http://[::1]/a.png"]}, 400, "invalid_image"),
    ("POST", RUNS, {"question": "x", "images": ["http://10.0.0.1/a.png"]}, 400, "invalid_image"),
    ("POST", RUNS, {"question": "x", "images": ["https://user:pw@127.0.0.1/a.png"]}, 400, "invalid_image"),
    # malformed URLs (a ValueError and a 500 from the URL parser once)
    ("POST", RUNS, {"question": "x", "images": ["http://1.1.1.1:99999/x.png"]}, 400, "invalid_image"),
    ("POST", RUNS, {"question": "x", "images": ["http://[::1/"]}, 400, "invalid_image"),
    ("POST", RUNS, {"question": "x", "images": ["http://example.com:abc/x.png"]}, 400, "invalid_image"),
    ("POST", RUNS, {"question": "x", "images": ["https://example.com:-1/"]}, 400, "invalid_image"),
    ("POST", RUNS, {"question": "x", "images": ["http://a..b/x.png"]}, 400, "invalid_image"),
    ("POST", SELECT, select_with_image("http://1.1.1.1:99999/x.png"), 400, "invalid_image"),
    ("POST", SELECT, select_with_image("http://[::1/"), 400, "invalid_image"),
    ("POST", SELECT, select_with_image("file:///etc/passwd"), 400, "invalid_image"),
    ("POST", SELECT, select_with_image("bm90IGFuIGltYWdl"), 400, "invalid_image"),
    ("POST", RUNS, {"question": "x", "images": ["x"] * 5}, 413, "payload_too_large"),
    # routes
    ("GET", "/no/such/route", None, 404, "not_found"),
    ("POST", "/v1/agent/run", {"question": "x"}, 404, "not_found"),
    ("POST", "/health", None, 405, "method_not_allowed"),
    ("PUT", RUNS, None, 405, "method_not_allowed"),
]


@pytest.mark.parametrize(("method", "path", "body", "status", "code"), CASES,
                         ids=[f"{i}-{c[3]}-{c[4]}" for i, c in enumerate(CASES)])
def test_refusals(client: httpx.Client, error_shape: ErrorShape, method: str, path: str, body: Any,
                  status: int, code: str | None) -> None:
    if isinstance(body, bytes):
        r = client.request(method, path, content=body, headers={"content-type": "application/json"})
    elif body is None:
        r = client.request(method, path)
    else:
        r = client.request(method, path, json=body)
    err = error_shape(r, status, code)
    if status == 422:
        assert isinstance(err.get("details"), list) and err["details"]


@pytest.mark.parametrize("content", [
    "x" * 1000,  # string content
    [{"type": "text", "text": "x" * 1000}],  # a text part
    [{"type": "text", "text": "x" * 500}, {"type": "text", "text": "y" * 501}],  # parts add up
])
def test_select_bounds_the_message_text(small_server: str, error_shape: ErrorShape, content: Any) -> None:
    """Runs refuse a question over max_question_chars (100 on this server) with 413; /v1/ssr/select
    must bound its messages' text too (here 10x over), or any body under max_body_bytes becomes one
    huge prefill."""
    with httpx.Client(base_url=small_server, timeout=60) as c:
        assert c.post(RUNS, json={"question": "x" * 101, "max_turns": 1}).status_code == 413
        r = c.post(SELECT, json={"messages": [{"role": "user", "content": content}]})
        error_shape(r, 413, "payload_too_large")
        ok = c.post(SELECT, json={"messages": [{"role": "user", "content": "What is it?"}]})
        assert ok.status_code == 200, ok.text


@pytest.mark.parametrize(("path", "raw"), [
    (RUNS, b'{"question": "\\ud800 what is it?", "max_turns": 1}'),
    (RUNS, b'{"question": "x", "candidates": ["\\ud800 search"], "max_turns": 1}'),
    (SELECT, b'{"messages": [{"role": "user", "content": "\\ud800"}]}'),
    (SELECT, b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}'),
    (SELECT, b'{"messages": [{"role": "user", "content": "x"}], "candidates": ["\\ud800"]}'),
    (RUNS, b'{"question": "x", "images": ["\\ud800"], "max_turns": 1}'),
], ids=["run-question", "run-candidates", "select-content", "select-text-part", "select-candidates",
        "run-image"])
def test_lone_surrogates_are_refused_not_a_500(client: httpx.Client, error_shape: ErrorShape, path: str,
                                               raw: bytes) -> None:
    """JSON may carry an escaped lone surrogate ("\\ud800"); it is not text the tokenizer can encode,
    so it must be refused as bad input like the question field already is, never reach the engine."""
    r = client.post(path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code in (400, 422), r.text
    error_shape(r, r.status_code)


@pytest.mark.parametrize("data", [b"hello, this is text", PNG_MAGIC + b"\x00" * 64, b"GIF89a" + b"\x00" * 10,
                                  b"\xff\xd8\xff" + b"\x00" * 32])
def test_error_messages_carry_no_object_reprs(client: httpx.Client, error_shape: ErrorShape,
                                              data: bytes) -> None:
    """Pillow's messages quote their objects ("cannot identify image file <_io.BytesIO object at
    0x7f...>"): no repr or memory address may reach a client."""
    for path, body in ((RUNS, {"question": "x", "images": [b64(data)]}),
                       (SELECT, select_with_image(b64(data)))):
        err = error_shape(client.post(path, json=body), 400, "invalid_image")
        assert not re.search(r"object at|0x[0-9a-f]{6,}|<_io\.", err["message"]), err["message"]


def test_validation_errors_name_the_field(client: httpx.Client, error_shape: ErrorShape) -> None:
    err = error_shape(client.post(RUNS, json={"images": []}), 422)
    assert "question" in err["message"]
    err = error_shape(client.post(RUNS, json={"question": "x", "tau": -1}), 422)
    assert "tau" in err["message"]
    err = error_shape(client.post(RUNS, json={"question": "x", "bogus": 1}), 422)
    assert "bogus" in err["message"]


def test_formats(client: httpx.Client, error_shape: ErrorShape, encode_image: Callable[..., bytes]) -> None:
    for fmt in ("PNG", "JPEG", "GIF", "WEBP", "BMP"):
        r = client.post(SELECT, json=select_with_image(b64(encode_image(fmt))))
        assert r.status_code == 200, (fmt, r.text)
    for fmt in ("TIFF", "ICO", "PPM"):
        r = client.post(SELECT, json=select_with_image(b64(encode_image(fmt, size=(64, 64)))))
        err = error_shape(r, 400, "invalid_image")
        assert "format" in err["message"], fmt
    gif = b64(encode_image("GIF"))
    r = client.post(RUNS, json={"question": "What is it?", "images": [gif], "max_turns": 1})
    assert r.status_code == 200, r.text


def test_truncated_and_extreme_images(client: httpx.Client, error_shape: ErrorShape,
                                      encode_image: Callable[..., bytes]) -> None:
    png = encode_image("PNG")
    error_shape(client.post(SELECT, json=select_with_image(b64(png[: len(png) // 2]))), 400, "invalid_image")
    sliver = io.BytesIO()
    Image.new("RGB", (1000, 5)).save(sliver, format="PNG")
    error_shape(client.post(SELECT, json=select_with_image(b64(sliver.getvalue()))), 400, "invalid_image")


@pytest.mark.parametrize("size", [(4100, 4100), (10000, 10000), (20000, 20000)])
def test_pixel_limit_and_decompression_bombs(client: httpx.Client, error_shape: ErrorShape,
                                             size: tuple[int, int]) -> None:
    # over the 16 MP limit; over Pillow's warning threshold; over its error threshold
    data = huge_png(*size)
    assert len(data) < 200_000
    err = error_shape(client.post(RUNS, json={"question": "x", "images": [b64(data)]}), 413,
                      "payload_too_large")
    assert "pixel" in err["message"] or "bomb" in err["message"]


# ---- servers with small limits -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_server(serve: Callable[..., Any]) -> Iterator[str]:
    settings = Settings(max_body_bytes=16 * 1024, max_image_pixels=5000, max_image_bytes=4096, max_turns=2,
                        max_question_chars=100)
    with serve(settings) as url:
        yield url


def test_declared_body_over_the_limit(small_server: str, error_shape: ErrorShape) -> None:
    with httpx.Client(base_url=small_server, timeout=60) as c:
        r = c.post(RUNS, json={"question": "x" * 20_000})
        assert int(r.request.headers["content-length"]) > 16 * 1024
        error_shape(r, 413, "payload_too_large")
        # under the limit is fine on the same server
        assert c.post(RUNS, json={"question": "x", "max_turns": 1}).status_code == 200


def test_streamed_body_over_the_limit(small_server: str, error_shape: ErrorShape) -> None:
    """Chunked upload, no Content-Length: the limit must still answer 413 (not a 400 parse error)."""

    def chunks() -> Iterator[bytes]:
        yield b'{"question": "'
        for _ in range(40):
            yield b"x" * 1000
        yield b'"}'

    with httpx.Client(base_url=small_server, timeout=60) as c:
        r = c.post(RUNS, content=chunks(), headers={"content-type": "application/json"})
        assert "content-length" not in r.request.headers
        assert r.request.headers.get("transfer-encoding") == "chunked"
        error_shape(r, 413, "payload_too_large")
        # a streamed body under the limit is read normally
        small = iter([b'{"question": "x",', b' "max_turns": 1}'])
        ok = c.post(RUNS, content=small, headers={"content-type": "application/json"})
        assert ok.status_code == 200, ok.text


def test_image_limits_of_the_server(small_server: str, error_shape: ErrorShape,
                                    encode_image: Callable[..., bytes]) -> None:
    with httpx.Client(base_url=small_server, timeout=60) as c:
        small = encode_image("PNG", size=(60, 60))  # 3600 px
        assert len(small) < 4096
        r = c.post(RUNS, json={"question": "x", "images": [b64(small)], "max_turns": 1})
        assert r.status_code == 200, r.text
        err = error_shape(c.post(RUNS, json={"question": "x", "images": [b64(huge_png(100, 100))],
                                             "max_turns": 1}), 413)
        assert "pixels" in err["message"]
        big_bytes = encode_image("BMP", size=(40, 40))  # few pixels, many bytes
        assert len(big_bytes) > 4096
        error_shape(c.post(SELECT, json=select_with_image(b64(big_bytes))), 413, "payload_too_large")
        error_shape(c.post(RUNS, json={"question": "x", "max_turns": 3}), 400, "invalid_request")


def test_default_max_turns_on_a_server_with_a_lower_limit(small_server: str) -> None:
    """A request that leaves max_turns out must not be refused because the schema's default (6) is
    over this server's limit (2): the default should follow the server's limit."""
    with httpx.Client(base_url=small_server, timeout=60) as c:
        r = c.post(RUNS, json={"question": "What is it?"})
        assert r.status_code == 200, r.text
        assert 1 <= len(r.json()["turns"]) <= 2


def test_api_key(serve: Callable[..., Any], error_shape: ErrorShape) -> None:
    with serve(Settings(api_key="s3cret")) as url, httpx.Client(base_url=url, timeout=60) as c:
        assert c.get("/health").status_code == 200
        assert c.get("/ready").status_code == 200
        assert c.get("/metrics").status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"},
                        {"Authorization": "s3cret"}):
            r = c.get("/v1/libraries", headers=headers)
            error_shape(r, 401, "unauthorized")
            assert r.headers.get("www-authenticate") == "Bearer"
        r = c.post(RUNS, json={"question": "x"})
        error_shape(r, 401, "unauthorized")
        ok = c.get("/v1/libraries", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200


def test_rejections_are_counted(client: httpx.Client, small_server: str, metrics_scrape: Any) -> None:
    before = metrics_scrape(client)
    httpx.post(small_server + RUNS, json={"question": "x" * 20_000}, timeout=60)
    after = metrics_scrape(client)
    key = 'ssr_requests_rejected_total{reason="body_too_large"}'
    assert after[key] - before.get(key, 0.0) == 1

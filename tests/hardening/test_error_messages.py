"""Error messages are ours: each attack the outside review tried gets a clear 4xx whose message may quote
the offending input, but never a library's file names, line numbers, log timestamps, memory addresses
or limits that are not the server's (xgrammar's ``[21:35:40] /project/cpp/...cc:5082:``, the TLS
library's ``(_ssl.c:1006)``, Pillow's 178,956,970 pixels, Python's 4,300-digit limit)."""

from __future__ import annotations

import datetime
import http.server
import re
import ssl
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ssr_server.core.config import Settings

LEAKS = re.compile(r"\.(cc|cpp|c|h|py|pyx):\d+|_ssl\.c|0x[0-9a-fA-F]{6,}|\[\d{1,2}:\d{2}:\d{2}\]|"
                   r"178[,.]?956[,.]?970|89[,.]?478[,.]?485|4[,.]?300|Traceback|File \"")


@pytest.fixture(scope="module")
def live(serve: Any) -> Iterator[Any]:
    with serve(Settings(allow_private_urls=True, url_timeout_s=10)) as live:
        yield live


def _message(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, r.text
    message = r.json()["error"]["message"]
    assert isinstance(message, str) and message
    assert not LEAKS.search(message), message
    return message


def _model(client: httpx.Client) -> str:
    return str(client.get("/v1/models").json()["data"][0]["id"])


@pytest.mark.parametrize(("parameters", "why"), [
    ({"type": "object", "properties": []}, "properties must be an object"),
    ({"type": "object", "properties": {"q": {"type": "string", "pattern": "(("}}}, "parenthesis"),
    ({"type": "object", "properties": {"n": {"type": "integer", "minimum": 5, "maximum": 1}}}, "range"),
])
def test_a_tool_schema_that_cannot_constrain_decoding_is_a_400_in_our_words(
        live: Any, parameters: dict[str, Any], why: str) -> None:
    with httpx.Client(base_url=live.url, timeout=60) as client:
        tools = [{"type": "function", "function": {"name": "lookup", "description": "look it up",
                                                   "parameters": parameters}}]
        body = {"model": _model(client), "messages": [{"role": "user", "content": "Look it up."}],
                "tools": tools, "tool_choice": "required"}
        message = _message(client.post("/v1/chat/completions", json=body), 400)
    assert "JSON schema" in message and why in message, message


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An https server on 127.0.0.1 with a self-signed certificate (so verification fails)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    folder: Path = tmp_path_factory.mktemp("tls")
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                       serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "cert.pem", folder / "key.pem")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/picture.png"
    finally:
        server.shutdown()
        server.server_close()


def test_an_image_url_with_an_unverifiable_certificate_is_a_400_in_our_words(live: Any,
                                                                              tls_server: str) -> None:
    with httpx.Client(base_url=live.url, timeout=60) as client:
        r = client.post("/v1/agent/runs", json={"question": "What is this?", "images": [tls_server]})
    message = _message(r, 400)
    assert "TLS certificate" in message and "could not be verified" in message, message


def test_an_image_url_nobody_listens_on_is_a_400_in_our_words(live: Any) -> None:
    import socket

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/picture.png"
    with httpx.Client(base_url=live.url, timeout=60) as client:
        r = client.post("/v1/agent/runs", json={"question": "What is this?", "images": [url]})
    assert "could not connect" in _message(r, 400)


def _png_header(width: int, height: int) -> bytes:
    """A PNG that declares ``width`` x ``height`` (Pillow's open reads only this far)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")

    ihdr = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([1, 0, 0, 0, 0])
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00")) + \
        chunk(b"IEND", b"")


@pytest.mark.parametrize("size", [(5000, 5000), (10_000, 10_000), (20_000, 20_000)])
def test_a_pixel_bomb_quotes_the_servers_limit(live: Any, size: tuple[int, int]) -> None:
    import base64

    image = base64.b64encode(_png_header(*size)).decode()
    with httpx.Client(base_url=live.url, timeout=60) as client:
        r = client.post("/v1/agent/runs", json={"question": "x", "images": [image]})
    message = _message(r, 413)
    assert "16000000" in message, message  # the server's limit (SSR_MAX_IMAGE_PIXELS), not Pillow's


def test_a_body_with_a_five_thousand_digit_integer_is_named_for_what_it_is(live: Any) -> None:
    body = b'{"question": "x", "seed": ' + b"7" * 5000 + b"}"
    with httpx.Client(base_url=live.url, timeout=60) as client:
        for path in ("/v1/agent/runs", "/v1/chat/completions"):
            r = client.post(path, content=body, headers={"content-type": "application/json"})
            message = _message(r, 400)
            assert "UTF-8" not in message and "number too long" in message, message

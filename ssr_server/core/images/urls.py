"""Fetching an image URL, SSRF-safe.

http(s) only; the host is resolved and every address must be public (loopback, private, link-local,
reserved, multicast and unspecified are refused unless the deployment allows private addresses); the
connection goes to the address that was checked (no DNS rebinding between check and connect; TLS still
verifies the original host name); redirects are followed by hand and every hop is checked again; the
body is streamed under a byte cap and the whole fetch under a deadline. One parser (httpx's) reads a
URL for the checks and for the connection, so the two cannot disagree about the host; a URL it cannot
parse, a port outside 1..65535 or a host that is neither an IP literal nor a valid DNS name is refused
(``InvalidImage``, a 400) before any name lookup.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import ssl
from dataclasses import dataclass

import httpx

from ssr_server.core.errors import InvalidImage, PayloadTooLarge, public_message
from ssr_server.core.images.limits import ImageLimits

_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
_NUMERIC_LABEL = re.compile(r"^(0x[0-9a-f]*|[0-9]+)$")
_IPV4_CHARS = re.compile(r"^[0-9a-fx.]+$")  # inet_aton would also accept trailing junk after a space
# httpx raises these (InvalidURL, IDNA and encoding errors) for URLs it cannot read.
_URL_ERRORS = (httpx.InvalidURL, ValueError, UnicodeError, TypeError)


@dataclass(frozen=True)
class _Target:
    url: httpx.URL
    host: str  # lower-case ASCII (IDNA) host, no brackets
    port: int
    literal: str | None  # the address when the host is an IP literal (no lookup)


def _parse_url(text: str) -> httpx.URL:
    try:
        return httpx.URL(text)
    except httpx.InvalidURL as exc:
        raise InvalidImage(f"image URL is malformed: {public_message(str(exc))}") from None
    except _URL_ERRORS:
        raise InvalidImage("image URL is malformed") from None


def _literal(host: str) -> str | None:
    """The address if ``host`` is an IP literal, in any form a resolver reads as one ("127.1")."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    if not _NUMERIC_LABEL.match(host.rstrip(".").rsplit(".", 1)[-1]):
        return None
    # A name ending in a number is an IPv4 form or nothing (as in the WHATWG URL standard): it is never
    # looked up as a name.
    if _IPV4_CHARS.match(host):
        try:
            return socket.inet_ntoa(socket.inet_aton(host.rstrip(".")))
        except OSError:
            pass
    raise InvalidImage(f"image URL host {host!r} is not a valid IPv4 address")


def _check_url(url: httpx.URL, limits: ImageLimits) -> _Target:
    if url.scheme not in ("http", "https"):
        raise InvalidImage(f"URL scheme not allowed: {url.scheme!r}; use http or https")
    host = url.raw_host.decode("ascii", "replace").lower()
    if not host:
        raise InvalidImage("image URL has no host")
    if url.userinfo:
        raise InvalidImage("image URLs with credentials are not accepted")
    port = url.port
    if port is not None and not 1 <= port <= 65535:
        raise InvalidImage(f"image URL port {port} is out of range (1..65535)")
    literal = _literal(host)
    if literal is None:
        name = host.removesuffix(".")
        if len(name) > 253 or not all(_LABEL.match(label) for label in name.split(".")):
            raise InvalidImage(f"image URL host {host!r} is not a valid host name")
    if limits.allowlist and not any(host == d or host.endswith("." + d) for d in limits.allowlist):
        raise InvalidImage(f"image URL host {host!r} is not in the allow-list")
    return _Target(url, host, port or (443 if url.scheme == "https" else 80), literal)


def _check_address(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, host: str) -> None:
    if isinstance(ip, ipaddress.IPv6Address) and ip.sixtofour is not None:
        _check_address(ip.sixtofour, host)  # 2002::/16 embeds an IPv4 address a relay would reach
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    bad = (ip.is_loopback or ip.is_private or ip.is_link_local or ip.is_reserved or ip.is_multicast
           or ip.is_unspecified or not ip.is_global)
    if bad:
        raise InvalidImage(f"image URL host {host!r} resolves to a non-public address ({ip}); refused")


async def _resolve(target: _Target, limits: ImageLimits) -> str:
    """Resolve and vet the host; returns the address to connect to."""
    if target.literal is not None:
        addrs = [target.literal]
    else:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            raise InvalidImage(f"image URL host {target.host!r} does not resolve") from None
        addrs = list(dict.fromkeys(str(i[4][0]) for i in infos))
    if not limits.allow_private:
        for a in addrs:
            _check_address(ipaddress.ip_address(a), target.host)
    return addrs[0]


async def fetch_url(url: str, limits: ImageLimits, client: httpx.AsyncClient | None = None) -> bytes:
    own = client is None
    client = client or httpx.AsyncClient(follow_redirects=False, trust_env=False)
    try:
        async with asyncio.timeout(limits.timeout_s):
            return await _fetch(_parse_url(url), limits, client)
    except TimeoutError:
        raise InvalidImage(f"fetching the image URL took longer than {limits.timeout_s:g} s") from None
    finally:
        if own:
            await client.aclose()


async def _fetch(url: httpx.URL, limits: ImageLimits, client: httpx.AsyncClient) -> bytes:
    for _ in range(limits.max_redirects + 1):
        t = _check_url(url, limits)
        ip = await _resolve(t, limits)
        default_port = t.port == (443 if url.scheme == "https" else 80)
        shown = f"[{t.host}]" if ":" in t.host else t.host
        # Connect to the vetted address; keep the Host header and TLS name of the original host.
        headers = {"Host": shown if default_port else f"{shown}:{t.port}", "Accept": "image/*"}
        extensions = {"sni_hostname": t.host} if url.scheme == "https" else {}
        try:
            target = url.copy_with(host=ip)
            async with client.stream("GET", target, headers=headers, extensions=extensions,
                                     follow_redirects=False) as resp:
                if resp.status_code in (301, 302, 303, 307, 308):
                    loc = resp.headers.get("location")
                    if not loc:
                        raise InvalidImage("image URL redirected without a Location")
                    url = _redirect(url, loc)
                    continue
                if resp.status_code != 200:
                    raise InvalidImage(f"image URL answered HTTP {resp.status_code}")
                declared = resp.headers.get("content-length")
                if declared and declared.isdigit() and int(declared) > limits.max_bytes:
                    raise PayloadTooLarge(
                        f"image at URL is {declared} bytes; the limit is {limits.max_bytes}")
                buf = bytearray()
                async for piece in resp.aiter_bytes():
                    buf += piece
                    if len(buf) > limits.max_bytes:
                        raise PayloadTooLarge(f"image at URL is over the {limits.max_bytes}-byte limit")
                return bytes(buf)
        except (httpx.HTTPError, httpx.StreamError, *_URL_ERRORS) as exc:
            raise InvalidImage(f"fetching the image URL failed: {_why(exc, t)}") from None
    raise InvalidImage(f"image URL redirected more than {limits.max_redirects} times")


def _causes(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    return chain


def _why(exc: BaseException, target: _Target) -> str:
    """Our words for a failed fetch: the TLS library's and httpx's texts name their own files and
    internals (``certificate verify failed: ... (_ssl.c:1006)``), which a client has no use for."""
    where = f"{target.host}:{target.port}"
    causes = _causes(exc)
    if any(isinstance(c, ssl.SSLCertVerificationError) for c in causes):
        return f"the TLS certificate of {where} could not be verified"
    if any(isinstance(c, ssl.SSLError) for c in causes):
        return f"the TLS handshake with {where} failed"
    if isinstance(exc, httpx.TimeoutException):
        return f"{where} did not answer in time"
    if isinstance(exc, httpx.ConnectError):
        return f"could not connect to {where}"
    if isinstance(exc, httpx.RemoteProtocolError):
        return f"{where} did not answer with valid HTTP"
    if isinstance(exc, httpx.NetworkError):
        return f"the connection to {where} broke"
    if isinstance(exc, httpx.DecodingError):
        return f"{where} sent a body that could not be decoded"
    if isinstance(exc, _URL_ERRORS):
        return "the URL cannot be fetched"
    return f"{where}: the request failed"


def _redirect(url: httpx.URL, location: str) -> httpx.URL:
    try:
        return url.join(location)
    except _URL_ERRORS:
        raise InvalidImage("image URL redirected to a malformed URL") from None

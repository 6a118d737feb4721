"""Safe image intake: base64, data URLs and http(s) URLs, with size, pixel and format limits.

URL fetching is SSRF-safe: http(s) only; the host is resolved and every address must be public
(loopback, private, link-local, reserved, multicast and unspecified are refused unless the deployment
allows private addresses); the connection goes to the address that was checked (no DNS rebinding
between check and connect; TLS still verifies the original host name); redirects are followed by hand
and every hop is checked again; the body is streamed under a byte cap and the whole fetch under a
deadline.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import ipaddress
import re
import socket
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

import httpx
from PIL import Image

from ssr_server.engine.base import ImageRef
from ssr_server.errors import InvalidImage, PayloadTooLarge

ALLOWED_FORMATS = frozenset({"PNG", "JPEG", "WEBP", "GIF", "BMP"})
_DATA_URL = re.compile(r"^data:image/[a-zA-Z0-9.+-]+;base64,", re.IGNORECASE)


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int = 8 * 1024 * 1024
    max_pixels: int = 16_000_000
    allow_private: bool = False
    allowlist: tuple[str, ...] = ()
    timeout_s: float = 10.0
    max_redirects: int = 3


def decode_image_bytes(data: bytes, limits: ImageLimits) -> ImageRef:
    """Open, check and decode: formats, pixel count and Pillow's decompression-bomb guard -> 4xx."""
    if len(data) > limits.max_bytes:
        raise PayloadTooLarge(f"image is {len(data)} bytes; the limit is {limits.max_bytes}")
    # The pixel check runs on the header, before any decoding; an explicit bound rather than Pillow's
    # DecompressionBombWarning, whose warnings filter is process-wide and not thread-safe.
    max_pixels = min(limits.max_pixels, Image.MAX_IMAGE_PIXELS or limits.max_pixels)
    try:
        img = Image.open(io.BytesIO(data))
        if img.format not in ALLOWED_FORMATS:
            raise InvalidImage(f"image format {img.format} is not accepted; use one of "
                               f"{sorted(ALLOWED_FORMATS)}")
        w, h = img.size
        if w * h > max_pixels:
            raise PayloadTooLarge(f"image is {w}x{h} pixels; the limit is {max_pixels} pixels")
        if min(w, h) < 1 or max(w, h) / min(w, h) > 100:
            raise InvalidImage(f"image aspect ratio {w}x{h} is too extreme (at most 100:1)")
        img.load()
        rgb = img.convert("RGB")
    except (InvalidImage, PayloadTooLarge):
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise PayloadTooLarge(f"image rejected as a decompression bomb: {exc}") from None
    except Exception as exc:  # Pillow raises many types for broken files
        raise InvalidImage(f"image could not be decoded: {type(exc).__name__}: {exc}") from None
    return ImageRef.from_pil(rgb)


def decode_base64(spec: str, limits: ImageLimits) -> bytes:
    payload = _DATA_URL.sub("", spec.strip(), count=1)
    if len(payload) * 3 // 4 > limits.max_bytes + 3:
        raise PayloadTooLarge(f"image is over the {limits.max_bytes}-byte limit")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidImage("image is neither valid base64 nor an http(s) URL") from None


async def load_image(spec: str, limits: ImageLimits, client: httpx.AsyncClient | None = None) -> ImageRef:
    s = spec.strip()
    if s.lower().startswith(("http://", "https://")):
        data = await fetch_url(s, limits, client)
    elif "://" in s[:16]:
        raise InvalidImage(f"URL scheme not allowed: {s.split('://', 1)[0]!r}; use http or https")
    else:
        data = decode_base64(s, limits)
    return await asyncio.to_thread(decode_image_bytes, data, limits)


def _check_address(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, host: str) -> None:
    if isinstance(ip, ipaddress.IPv6Address) and ip.sixtofour is not None:
        _check_address(ip.sixtofour, host)  # 2002::/16 embeds an IPv4 address a relay would reach
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    bad = (ip.is_loopback or ip.is_private or ip.is_link_local or ip.is_reserved or ip.is_multicast
           or ip.is_unspecified or not ip.is_global)
    if bad:
        raise InvalidImage(f"image URL host {host!r} resolves to a non-public address ({ip}); refused")


async def _resolve(host: str, port: int, limits: ImageLimits) -> str:
    """Resolve and vet ``host``; returns the address to connect to."""
    try:
        literal = ipaddress.ip_address(host)
        addrs = [str(literal)]
    except ValueError:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise InvalidImage(f"image URL host {host!r} does not resolve: {exc}") from None
        addrs = list(dict.fromkeys(str(i[4][0]) for i in infos))
    if not limits.allow_private:
        for a in addrs:
            _check_address(ipaddress.ip_address(a), host)
    return addrs[0]


def _check_url(url: str, limits: ImageLimits) -> tuple[str, str, int]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise InvalidImage(f"URL scheme not allowed: {parts.scheme!r}; use http or https")
    host = parts.hostname
    if not host:
        raise InvalidImage("image URL has no host")
    if parts.username or parts.password:
        raise InvalidImage("image URLs with credentials are not accepted")
    if limits.allowlist and not any(host == d or host.endswith("." + d) for d in limits.allowlist):
        raise InvalidImage(f"image URL host {host!r} is not in the allow-list")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, host, port


async def fetch_url(url: str, limits: ImageLimits, client: httpx.AsyncClient | None = None) -> bytes:
    own = client is None
    client = client or httpx.AsyncClient(follow_redirects=False, trust_env=False)
    try:
        async with asyncio.timeout(limits.timeout_s):
            return await _fetch(url, limits, client)
    except TimeoutError:
        raise InvalidImage(f"fetching the image URL took longer than {limits.timeout_s:g} s") from None
    finally:
        if own:
            await client.aclose()


async def _fetch(url: str, limits: ImageLimits, client: httpx.AsyncClient) -> bytes:
    for _ in range(limits.max_redirects + 1):
        scheme, host, port = _check_url(url, limits)
        ip = await _resolve(host, port, limits)
        # Connect to the vetted address; keep the Host header and TLS name of the original host.
        target = httpx.URL(url).copy_with(host=ip)
        headers = {"Host": host if port in (80, 443) else f"{host}:{port}", "Accept": "image/*"}
        extensions = {"sni_hostname": host} if scheme == "https" else {}
        try:
            async with client.stream("GET", target, headers=headers, extensions=extensions,
                                     follow_redirects=False) as resp:
                if resp.status_code in (301, 302, 303, 307, 308):
                    loc = resp.headers.get("location")
                    if not loc:
                        raise InvalidImage("image URL redirected without a Location")
                    url = urljoin(url, loc)
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
        except httpx.HTTPError as exc:
            raise InvalidImage(f"fetching the image URL failed: {type(exc).__name__}: {exc}") from None
    raise InvalidImage(f"image URL redirected more than {limits.max_redirects} times")

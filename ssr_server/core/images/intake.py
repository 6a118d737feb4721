"""Safe image intake: base64, data URLs and http(s) URLs (fetched by ``image_urls``), with size, pixel
and format limits.

Decoding is bounded: at most as many images decode at once as ``decode_slots`` allows (a 16 MP image
is 48 MB of pixels, more while converting), and what the server keeps is downscaled to ``keep_pixels``,
so every later step (the model's image processor, zoom, image search) sees that resolution.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ctypes
import ctypes.util
import functools
import io
import math
import re

import httpx
from PIL import Image, UnidentifiedImageError

from ssr_server.core.errors import InvalidImage, PayloadTooLarge, public_message
from ssr_server.core.images.limits import ImageLimits
from ssr_server.core.images.urls import fetch_url
from ssr_server.core.protocol import ImageRef

ALLOWED_FORMATS = frozenset({"PNG", "JPEG", "WEBP", "GIF", "BMP"})
_DATA_URL = re.compile(r"^data:image/[a-zA-Z0-9.+-]+;base64,", re.IGNORECASE)
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def return_freed_memory_to_the_os() -> None:
    """Let freed image buffers leave the process (glibc only; elsewhere a no-op).

    glibc serves large blocks with mmap and unmaps them when freed, but after the first such free it
    raises its mmap threshold (up to 32 MB), so later image buffers (Pillow allocates in 16 MB blocks)
    come from per-thread heaps that keep them after free: RSS then grows with every decode thread's
    high-water mark. A fixed 1 MB threshold keeps big buffers mmapped (and turns the adjustment off).
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, 1 << 20)
    except (OSError, AttributeError):
        pass


def _downscale(img: Image.Image, keep_pixels: int | None) -> Image.Image:
    w, h = img.size
    if keep_pixels is None or w * h <= keep_pixels:
        return img
    scale = math.sqrt(keep_pixels / (w * h))
    size = (max(1, int(w * scale)), max(1, int(h * scale)))
    # reducing_gap: a cheap integer box reduction first, then Lanczos on the much smaller picture.
    return img.resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0)


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
        if limits.keep_pixels is not None and w * h > limits.keep_pixels and img.format == "JPEG":
            # libjpeg decodes at 1/2, 1/4 or 1/8 scale directly: less memory and time than full size.
            scale = math.sqrt(limits.keep_pixels / (w * h))
            img.draft("RGB", (math.ceil(w * scale), math.ceil(h * scale)))
        img.load()
        rgb = _downscale(img if img.mode == "RGB" else img.convert("RGB"), limits.keep_pixels)
    except (InvalidImage, PayloadTooLarge):
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        # Pillow refuses at open, before our own check can run, images past twice its own limit; its
        # message quotes that limit, not the server's.
        raise PayloadTooLarge(f"image has more pixels than the limit of {limits.max_pixels}") from None
    except UnidentifiedImageError:
        raise InvalidImage(f"image format not recognised; use one of {sorted(ALLOWED_FORMATS)}") from None
    except Exception as exc:  # Pillow raises many types for broken files; its words say what is broken
        why = public_message(str(exc)) or "the file is damaged"
        raise InvalidImage(f"image could not be decoded: {why}") from None
    return ImageRef.from_pil(rgb)


def decode_base64(spec: str, limits: ImageLimits) -> bytes:
    payload = _DATA_URL.sub("", spec.strip(), count=1)
    if len(payload) * 3 // 4 > limits.max_bytes + 3:
        raise PayloadTooLarge(f"image is over the {limits.max_bytes}-byte limit")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidImage("image is neither valid base64 nor an http(s) URL") from None


async def decode_bounded(data: bytes, limits: ImageLimits) -> ImageRef:
    """``decode_image_bytes`` in a worker thread, holding one of ``limits.decode_slots``."""
    if limits.decode_slots is None:
        return await asyncio.to_thread(decode_image_bytes, data, limits)
    slots = limits.decode_slots
    await slots.acquire()
    loop = asyncio.get_running_loop()
    work = loop.run_in_executor(None, functools.partial(decode_image_bytes, data, limits))

    def done(f: asyncio.Future[ImageRef]) -> None:
        # The slot is freed when the thread is done, not when a cancelled caller stops waiting:
        # the bound holds for the pixels in memory, not only for the requests still waiting.
        slots.release()
        if not f.cancelled():
            f.exception()  # retrieved, so a caller gone meanwhile leaves no "never retrieved" log

    work.add_done_callback(done)
    return await asyncio.shield(work)


async def load_image(spec: str, limits: ImageLimits, client: httpx.AsyncClient | None = None) -> ImageRef:
    s = spec.strip()
    if s.lower().startswith(("http://", "https://")):
        data = await fetch_url(s, limits, client)
    elif "://" in s[:16]:
        raise InvalidImage(f"URL scheme not allowed: {s.split('://', 1)[0]!r}; use http or https")
    else:
        data = decode_base64(s, limits)
    return await decode_bounded(data, limits)


__all__ = ["ALLOWED_FORMATS", "decode_base64", "decode_bounded", "decode_image_bytes", "load_image",
           "return_freed_memory_to_the_os"]

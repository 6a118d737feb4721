"""What the store keeps of an image: the pixels the model saw (after intake's downscaling), losslessly as
PNG when that fits the bound, else as JPEG, smaller until it fits; a zoom's crop is cut again from its
stored source image with the same box, so the viewer can draw the box on the source and show the crop."""

from __future__ import annotations

import io
from typing import Any

from PIL import Image

from ssr_server.store.records import ImageBlob
from ssr_server.tools.zoom import pixel_box

_JPEG_QUALITY = (90, 80, 70)
_MIN_SIDE = 64


def encode(image: Image.Image, max_bytes: int, source: str = "input", parent: int | None = None,
           box: tuple[int, int, int, int] | None = None) -> ImageBlob:
    """``image`` (RGB) within ``max_bytes``: PNG if it fits, else JPEG at falling quality, then size."""
    # zlib level 1: a third of the default's CPU for a few percent more bytes (the server's cores are
    # the engine's; the image is written once and read rarely)
    png = _save(image, "PNG", compress_level=1)
    if len(png) <= max_bytes:
        return ImageBlob(png, "image/png", image.width, image.height, source, parent, box)
    scaled = image
    while True:
        for quality in _JPEG_QUALITY:
            data = _save(scaled, "JPEG", quality=quality)
            if len(data) <= max_bytes or min(scaled.size) <= _MIN_SIDE:
                return ImageBlob(data, "image/jpeg", scaled.width, scaled.height, source, parent, box)
        w, h = scaled.size
        scaled = scaled.resize((max(1, int(w * 0.7)), max(1, int(h * 0.7))), Image.Resampling.LANCZOS)


def zoom_crop(parent: ImageBlob, n_parent: int, box: tuple[int, int, int, int], max_bytes: int) -> ImageBlob:
    """The zoom's region of its stored source image (at the stored image's resolution)."""
    with Image.open(io.BytesIO(parent.data)) as img:
        rgb = img.convert("RGB")
    crop = rgb.crop(pixel_box(box, rgb.width, rgb.height))
    return encode(crop, max_bytes, source="zoom", parent=n_parent, box=box)


def zoom_of(tool_data: dict[str, Any] | None) -> tuple[int, int, tuple[int, int, int, int]] | None:
    """(new image number, source image number, box) of a successful zoom's structured result."""
    if not tool_data:
        return None
    box, src, new = tool_data.get("box"), tool_data.get("source_image"), tool_data.get("image")
    if not (isinstance(box, list) and len(box) == 4 and all(isinstance(v, int) for v in box)
            and isinstance(src, int) and isinstance(new, int)):
        return None
    return new, src, (box[0], box[1], box[2], box[3])


def _save(image: Image.Image, fmt: str, **kwargs: Any) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, **kwargs)
    return buf.getvalue()

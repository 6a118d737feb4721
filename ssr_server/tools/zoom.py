"""Zoom: crop a region of a context image and upscale it, so a small model can read small details.

Boxes are in 0-1000 relative coordinates ``[x1, y1, x2, y2]`` (the convention Qwen-VL style models
emit), independent of the image's pixel size. The crop is returned as a new image that the agent
appends to the context; the observation text tells the model which number it got.
"""

from __future__ import annotations

import asyncio

from PIL import Image

from ssr_server.core.actions import ToolCall, validate_box
from ssr_server.core.limits import BOX_SCALE
from ssr_server.core.protocol import ImageRef
from ssr_server.tools.base import Observation, ToolContext
from ssr_server.tools.common import pick_image


def pixel_box(box: tuple[int, int, int, int], width: int, height: int) -> tuple[int, int, int, int]:
    """The pixel rectangle (left, top, right, bottom) of a relative box, at least 1 pixel each way."""
    x1, y1, x2, y2 = box
    left, top = x1 * width // BOX_SCALE, y1 * height // BOX_SCALE
    right = max(left + 1, min(width, -(-x2 * width // BOX_SCALE)))  # ceil, so the crop covers the box
    bottom = max(top + 1, min(height, -(-y2 * height // BOX_SCALE)))
    return left, top, right, bottom


def output_size(width: int, height: int, min_short_side: int, max_side: int) -> tuple[int, int]:
    """Upscale so the short side reaches ``min_short_side``, but never let the long side pass ``max_side``.

    The cap wins for very elongated crops: the vision encoder's cost grows with pixels, and a crop
    larger than ``max_side`` is downscaled for the same reason.
    """
    scale = max(1.0, min_short_side / min(width, height))
    if max(width, height) * scale > max_side:
        scale = max_side / max(width, height)
    return max(1, round(width * scale)), max(1, round(height * scale))


def zoom_crop(image: Image.Image, box: tuple[int, int, int, int], min_short_side: int = 224,
              max_side: int = 1024) -> Image.Image:
    """The crop of a valid relative ``box``, resized as ``output_size`` says (what the tool returns; the
    SFT picture drills draw their zoomed crops with it)."""
    crop = image.crop(pixel_box(box, image.width, image.height))
    size = output_size(crop.width, crop.height, min_short_side, max_side)
    return crop if size == crop.size else crop.resize(size, Image.Resampling.LANCZOS)


class ZoomTool:
    """Crops ``ctx.images[call.image_index]`` at ``call.box`` and returns the enlarged crop (a new image)."""

    name = "zoom"

    def __init__(self, *, min_short_side: int = 224, max_side: int = 1024, min_box_side: int = 20) -> None:
        if not 0 < min_short_side <= max_side:
            raise ValueError("need 0 < min_short_side <= max_side")
        self.min_short_side = min_short_side
        self.max_side = max_side
        self.min_box_side = min_box_side

    def _crop(self, image: Image.Image, box: tuple[int, int, int, int]) -> Image.Image:
        return zoom_crop(image, box, self.min_short_side, self.max_side)

    async def __call__(self, call: ToolCall, ctx: ToolContext) -> Observation:
        box = validate_box(call.box, self.min_box_side)
        pos, ref = pick_image(ctx, call.image_index)
        # Resampling a large image takes tens of ms: keep it off the event loop.
        crop = await asyncio.to_thread(self._crop, ref.image, box)
        # registry indices are 0-based: the crop becomes image len(ctx.images)
        return Observation(images=(ImageRef.from_pil(crop),),
                           data={"box": list(box), "label": call.label, "source_image": pos,
                                 "image": len(ctx.images), "size": list(crop.size)})

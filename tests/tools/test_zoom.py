from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from ssr_server.core.actions import ToolCall, validate_box
from ssr_server.core.errors import ToolError
from ssr_server.core.protocol import ImageRef
from ssr_server.tools.base import ToolContext
from ssr_server.tools.demo import demo_picture
from ssr_server.tools.zoom import ZoomTool, output_size, pixel_box


def _ctx(*images: Image.Image) -> ToolContext:
    return ToolContext(images=tuple(ImageRef.from_pil(i) for i in images))


def _split_image() -> Image.Image:
    """Left half red, right half blue: zooming into a half must give that colour."""
    img = Image.new("RGB", (200, 100), (255, 0, 0))
    img.paste((0, 0, 255), (100, 0, 200, 100))
    return img


async def test_zoom_quarter_upscales_short_side_and_numbers_the_crop() -> None:
    ctx = _ctx(demo_picture("k-eiffel-tower"), demo_picture("k-koala"))
    obs = await ZoomTool()(ToolCall("zoom", box=(0, 0, 500, 500), image_index=0), ctx)
    assert obs.ok
    (crop,) = obs.images
    assert crop.image.size == (314, 224)  # 112x80 crop, scaled by 224/80
    # registry indices are 0-based: image 0 was cropped, the crop becomes image 2
    assert obs.data["size"] == [314, 224] and obs.data["source_image"] == 0 and obs.data["image"] == 2
    assert crop.digest != ctx.images[0].digest


async def test_zoom_crops_the_chosen_image_and_keeps_content() -> None:
    ctx = _ctx(demo_picture("k-koala"), _split_image())
    obs = await ZoomTool()(ToolCall("zoom", box=(550, 100, 950, 900), image_index=1), ctx)
    assert obs.data["source_image"] == 1
    crop = obs.images[0].image
    r, _, b = crop.getpixel((crop.width // 2, crop.height // 2))  # type: ignore[misc]
    assert b > 200 and r < 50
    left = await ZoomTool()(ToolCall("zoom", box=(50, 100, 450, 900), image_index=-1), ctx)
    assert left.images[0].image.getpixel((5, 5))[0] > 200  # type: ignore[index]


async def test_zoom_caps_long_side_and_downscales_big_images() -> None:
    big = Image.new("RGB", (2000, 1000), (10, 200, 10))
    obs = await ZoomTool()(ToolCall("zoom", box=(0, 0, 1000, 1000)), _ctx(big))
    assert obs.images[0].image.size == (1024, 512)
    thin = await ZoomTool()(ToolCall("zoom", box=(0, 0, 1000, 100)), _ctx(demo_picture("k-koala")))
    w, h = thin.images[0].image.size
    assert w == 1024 and h == 73  # 224x16 crop: the long-side cap wins over the short-side target


@pytest.mark.parametrize(
    ("box", "message"),
    [
        (None, "needs a box"),
        ((0, 0, 100), "4 numbers"),
        ((500, 0, 400, 100), "x1 < x2"),
        ((0, 300, 100, 300), "y1 < y2"),
        ((-5, 0, 100, 100), "outside"),
        ((0, 0, 100, 1001), "outside"),
        ((100, 100, 110, 500), "too small"),
        (("a", 0, 100, 100), "numbers"),
        ((True, 0, 100, 100), "numbers"),
        ((float("nan"), 0, 100, 100), "finite"),  # JSON parsers let NaN and Infinity through
        ((0, 0, float("inf"), 100), "finite"),
    ],
)
async def test_bad_boxes_raise_tool_errors(box: Any, message: str) -> None:
    with pytest.raises(ToolError, match=message):
        await ZoomTool()(ToolCall("zoom", box=box), _ctx(demo_picture("k-koala")))


async def test_zoom_without_images_or_with_bad_index_fails() -> None:
    with pytest.raises(ToolError, match="no image"):
        await ZoomTool()(ToolCall("zoom", box=(0, 0, 500, 500)), ToolContext(images=()))
    with pytest.raises(ToolError, match="image index 2 does not exist; indices 0 to 0"):
        await ZoomTool()(ToolCall("zoom", box=(0, 0, 500, 500), image_index=2), _ctx(demo_picture("k-koala")))


def test_validate_box_rounds_floats() -> None:
    assert validate_box((0.4, 10.6, 500.2, 999.9)) == (0, 11, 500, 1000)


def test_pixel_box_covers_at_least_one_pixel() -> None:
    assert pixel_box((0, 0, 1000, 1000), 224, 160) == (0, 0, 224, 160)
    assert pixel_box((999, 999, 1000, 1000), 10, 10) == (9, 9, 10, 10)


@settings(max_examples=60, deadline=None)
@given(
    w=st.integers(1, 4000), h=st.integers(1, 4000),
    short=st.integers(16, 512), extra=st.integers(0, 2048),
)
def test_output_size_bounds(w: int, h: int, short: int, extra: int) -> None:
    cap = short + extra
    ow, oh = output_size(w, h, short, cap)
    assert max(ow, oh) <= cap
    if max(w, h) * short / min(w, h) <= cap:  # the target is reachable without breaking the cap
        assert min(ow, oh) >= short - 1
    scale = max(ow, oh) / max(w, h)  # one scale for both sides: the aspect ratio is kept
    assert abs(ow - w * scale) <= 1 and abs(oh - h * scale) <= 1


@settings(max_examples=25, deadline=None)
@given(
    x1=st.integers(0, 980), y1=st.integers(0, 980),
    dw=st.integers(20, 1000), dh=st.integers(20, 1000),
)
async def test_any_valid_box_gives_bounded_crop(x1: int, y1: int, dw: int, dh: int) -> None:
    box = (x1, y1, min(1000, x1 + dw), min(1000, y1 + dh))
    if box[2] - box[0] < 20 or box[3] - box[1] < 20:
        return
    obs = await ZoomTool()(ToolCall("zoom", box=box), _ctx(demo_picture("k-great-wave-off-kanagawa")))
    w, h = obs.images[0].image.size
    assert max(w, h) <= 1024 and min(w, h) >= 1
    assert max(w, h) == 1024 or min(w, h) >= 224

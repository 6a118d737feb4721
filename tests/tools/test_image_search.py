from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageEnhance

from ssr_server.core.actions import ToolCall
from ssr_server.core.errors import ToolError
from ssr_server.core.protocol import ImageRef
from ssr_server.tools.base import ToolContext
from ssr_server.tools.demo import DemoWorld, demo_picture, shipped_demo_world
from ssr_server.tools.image_search import HTTPImageSearchBackend, ImageHit, ImageSearchTool, LocalImageIndex

# (id, title, url) of every entity, from the index file the demo world ships
ENTITIES = [(e["id"], e["title"], e["url"])
            for e in json.loads(shipped_demo_world().image_index_path.read_text())["images"]]
ALL_IDS = [eid for eid, _, _ in ENTITIES]


@pytest.fixture(scope="module")
def index(demo_assets: DemoWorld) -> LocalImageIndex:
    return LocalImageIndex(demo_assets.image_dir)


def _jpeg(img: Image.Image, size: tuple[int, int], quality: int, brightness: float = 1.0) -> Image.Image:
    """A re-shared copy of a picture: resized, brightness nudged, JPEG-compressed."""
    out = img.resize(size, Image.Resampling.BILINEAR)
    if brightness != 1.0:
        out = ImageEnhance.Brightness(out).enhance(brightness)
    buf = io.BytesIO()
    out.save(buf, format="JPEG", quality=quality)
    return Image.open(io.BytesIO(buf.getvalue())).convert("RGB")


def _ref(img: Image.Image) -> ImageRef:
    return ImageRef.from_pil(img)


async def test_every_entity_finds_itself(index: LocalImageIndex) -> None:
    assert len(index) == len(ALL_IDS)
    for eid, title, url in ENTITIES:
        hits = await index.search(_ref(demo_picture(eid)), 3)
        assert hits[0].title == title, eid
        assert hits[0].score == 1.0 and hits[0].url == url
        assert len(hits) == 1, (eid, hits)  # no look-alike (e.g. another framed painting) passes the cut


@pytest.mark.parametrize(
    ("size", "quality", "brightness"),
    [((300, 214), 60, 1.0), ((160, 114), 40, 1.0), ((640, 457), 85, 1.1), ((224, 160), 70, 0.85)],
)
async def test_perturbed_copies_still_match(
    index: LocalImageIndex, size: tuple[int, int], quality: int, brightness: float
) -> None:
    for eid, title, _ in ENTITIES:
        hits = await index.search(_ref(_jpeg(demo_picture(eid), size, quality, brightness)), 1)
        assert [h.title for h in hits] == [title], eid
        assert hits[0].score >= 1 - index.max_distance


async def test_unrelated_images_find_nothing(index: LocalImageIndex) -> None:
    noise = Image.fromarray(np.random.default_rng(0).integers(0, 256, (160, 224, 3), dtype=np.uint8))
    flat = Image.new("RGB", (224, 160), (120, 130, 140))
    gradient = Image.linear_gradient("L").resize((224, 160))
    for img in (noise, flat, gradient):
        assert await index.search(_ref(img), 3) == []
    tool = ImageSearchTool(index)
    obs = await tool(ToolCall("image_search"), ToolContext(images=(_ref(noise),)))
    assert obs.ok and obs.hits == () and obs.images == ()


async def test_tool_lists_hits_for_the_chosen_image(index: LocalImageIndex) -> None:
    ctx = ToolContext(images=(_ref(demo_picture("k-axolotl")), _ref(demo_picture("k-shinkansen"))))
    tool = ImageSearchTool(index, k=2)
    first = await tool(ToolCall("image_search", image_index=0), ctx)
    assert first.hits[0].title == "axolotl" and first.hits[0].text
    assert first.hits[0].score == 1.0 and first.data["image"] == 0
    # every hit of the local index comes with its indexed picture as a thumbnail, in hit order
    assert first.images == tuple(h.thumbnail for h in first.hits) and all(first.images)
    assert first.images[0].image.size == demo_picture("k-axolotl").size
    second = await tool(ToolCall("image_search", image_index=1), ctx)
    assert second.hits[0].title == "Shinkansen" and second.data["image"] == 1
    with pytest.raises(ToolError, match="no image"):
        await tool(ToolCall("image_search"), ToolContext(images=()))
    with pytest.raises(ToolError, match="does not exist"):
        await tool(ToolCall("image_search", image_index=5), ctx)
    assert (await tool(ToolCall("image_search", image_index=-1), ctx)).hits[0].title == "Shinkansen"


def test_index_load_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read image index"):
        LocalImageIndex(tmp_path)
    (tmp_path / "index.json").write_text(json.dumps({"images": []}))
    with pytest.raises(ValueError, match="non-empty 'images'"):
        LocalImageIndex(tmp_path)
    (tmp_path / "index.json").write_text(json.dumps({"images": [{"file": "missing.png", "title": "M"}]}))
    with pytest.raises(ValueError, match=r"missing\.png"):
        LocalImageIndex(tmp_path)
    (tmp_path / "index.json").write_text(json.dumps({"images": [{"file": 3}]}))
    with pytest.raises(ValueError, match="entry 0 needs"):
        LocalImageIndex(tmp_path)


async def test_http_backend_round_trip(live_server: str) -> None:
    backend = HTTPImageSearchBackend(f"{live_server}/images", headers={"X-Test": "1"})
    try:
        hits = await backend.search(_ref(_jpeg(demo_picture("k-tower-bridge"), (320, 228), 70)), 2)
        tool = ImageSearchTool(backend)
        obs = await tool(ToolCall("image_search"), ToolContext(images=(_ref(demo_picture("k-koala")),)))
    finally:
        await backend.aclose()
    assert hits[0].title == "Tower Bridge" and 0.8 < hits[0].score <= 1.0
    assert hits[0].thumbnail is not None and hits[0].thumbnail.image.size == (32, 24)
    assert obs.hits[0].title == "koala" and obs.images == tuple(h.thumbnail for h in obs.hits)


async def test_http_backend_tolerates_malformed_entries(live_server: str) -> None:
    hits = await HTTPImageSearchBackend(f"{live_server}/mixed").search(_ref(demo_picture("k-koala")), 5)
    assert hits == [ImageHit("Kept", "", "", 0.0, None)]


@pytest.mark.parametrize(
    ("prefix", "message"),
    [
        ("broken", "HTTP 500"),
        ("badjson", "not JSON"),
        ("noresults", "without a 'results' list"),
        ("slow", r"did not answer within 0\.2 s"),
    ],
)
async def test_http_backend_errors(live_server: str, prefix: str, message: str) -> None:
    backend = HTTPImageSearchBackend(f"{live_server}/{prefix}", timeout_s=0.2)
    with pytest.raises(ToolError, match=message):
        await backend.search(_ref(demo_picture("k-koala")), 3)
    await backend.aclose()


async def test_http_backend_unreachable(free_port_url: str) -> None:
    with pytest.raises(ToolError, match="unreachable"):
        await HTTPImageSearchBackend(free_port_url).search(_ref(demo_picture("k-koala")), 3)

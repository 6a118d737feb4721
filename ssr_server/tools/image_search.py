"""Image search: reverse-search a context image, with a local perceptual-hash index or an HTTP service.

HTTP contract (``HTTPImageSearchBackend``), deliberately small so any service can be wrapped::

    POST {base_url}/search
    Content-Type: application/json
    {"image": "<base64 of PNG bytes>", "k": 3}

    200 OK
    {"results": [{"title": "Eiffel Tower", "description": "A wrought-iron lattice tower ...",
                  "url": "https://...", "score": 0.93}, ...]}

``title`` is required; ``description`` and ``url`` default to ""; ``score`` is a similarity, higher is
better (0 if missing). Results are expected best first; at most ``k`` are used. Any other status, a
body that is not JSON, or JSON without a ``results`` list is a tool error.

The local index (``LocalImageIndex``) loads a folder with ``index.json``:
``{"images": [{"file", "title", "description", "url"}]}`` (the demo world writes one) and compares
images by perceptual hash, which survives resizing and JPEG recompression but not cropping.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx
import imagehash
from PIL import Image

from ssr_server.engine.base import ImageRef
from ssr_server.errors import ToolError
from ssr_server.tools.base import Observation, ToolCall, ToolContext
from ssr_server.tools.common import BackendTool, check_status, http_error, pick_image
from ssr_server.tools.text_search import format_hits


@dataclass(frozen=True)
class ImageHit:
    """One visually similar image; ``score`` is a similarity in [0, 1], higher is better."""

    title: str
    description: str
    url: str
    score: float


class ImageSearchBackend(Protocol):
    async def search(self, image: ImageRef, k: int) -> list[ImageHit]: ...


@dataclass(frozen=True)
class _Entry:
    hit: ImageHit
    phash: imagehash.ImageHash
    dhash: imagehash.ImageHash


def _hashes(image: Image.Image) -> tuple[imagehash.ImageHash, imagehash.ImageHash]:
    rgb = image if image.mode == "RGB" else image.convert("RGB")
    return imagehash.phash(rgb), imagehash.dhash(rgb)


class LocalImageIndex:
    """Nearest neighbours by the mean of normalised pHash and dHash Hamming distances.

    pHash (DCT) captures the coarse luminance layout and dHash (gradients) the edges; averaging them
    separates look-alike pictures (two framed paintings) that either alone confuses. On the demo world,
    re-encoded copies land below 0.11 and distinct pictures above 0.22, hence ``max_distance=0.18``.
    """

    def __init__(self, image_dir: str | os.PathLike[str], *, max_distance: float = 0.18) -> None:
        self.image_dir = Path(image_dir)
        self.max_distance = max_distance
        index_path = self.image_dir / "index.json"
        try:
            raw: Any = json.loads(index_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ValueError(f"{index_path}: cannot read image index ({e})") from None
        items = raw.get("images") if isinstance(raw, dict) else None
        if not isinstance(items, list) or not items:
            raise ValueError(f"{index_path}: expected a non-empty 'images' list")
        self._entries: list[_Entry] = []
        for n, item in enumerate(items):
            if not isinstance(item, dict) or not isinstance(item.get("file"), str) or not isinstance(
                item.get("title"), str
            ):
                raise ValueError(f"{index_path}: entry {n} needs string 'file' and 'title'")
            path = self.image_dir / item["file"]
            try:
                with Image.open(path) as img:
                    ph, dh = _hashes(img)
            except OSError as e:
                raise ValueError(f"{index_path}: entry {n}: cannot load {path} ({e})") from None
            hit = ImageHit(item["title"], str(item.get("description", "")), str(item.get("url", "")), 0.0)
            self._entries.append(_Entry(hit, ph, dh))

    def __len__(self) -> int:
        return len(self._entries)

    def distances(self, image: Image.Image) -> list[tuple[float, ImageHit]]:
        """All (distance, entry) pairs, nearest first; exposed for calibration and tests."""
        ph, dh = _hashes(image)
        bits_p, bits_d = ph.hash.size, dh.hash.size
        scored = [
            ((float(e.phash - ph) / bits_p + float(e.dhash - dh) / bits_d) / 2, e.hit) for e in self._entries
        ]
        scored.sort(key=lambda t: t[0])
        return scored

    def _search(self, image: Image.Image, k: int) -> list[ImageHit]:
        return [
            ImageHit(hit.title, hit.description, hit.url, round(1.0 - d, 4))
            for d, hit in self.distances(image)[: max(k, 0)]
            if d <= self.max_distance
        ]

    async def search(self, image: ImageRef, k: int) -> list[ImageHit]:
        return await asyncio.to_thread(self._search, image.image, k)


class HTTPImageSearchBackend:
    """Client for the JSON contract in the module docstring."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 10.0,
        client: httpx.AsyncClient | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})
        self._client = client
        self._owns_client = client is None

    def _get_client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout_s)
        return self._client

    async def aclose(self) -> None:
        if self._owns_client and self._client is not None:
            await self._client.aclose()
            self._client = None

    async def search(self, image: ImageRef, k: int) -> list[ImageHit]:
        png = await asyncio.to_thread(image.png_bytes)
        body = {"image": base64.b64encode(png).decode("ascii"), "k": k}
        try:
            r = await self._get_client().post(
                f"{self.base_url}/search", json=body, headers=self.headers, timeout=self.timeout_s
            )
        except httpx.HTTPError as e:
            raise http_error("the image search service", e, self.timeout_s) from e
        check_status("the image search service", r)
        try:
            payload: Any = r.json()
        except ValueError:
            raise ToolError("the image search service returned a response that is not JSON") from None
        results = payload.get("results") if isinstance(payload, dict) else None
        if not isinstance(results, list):
            raise ToolError("the image search service returned JSON without a 'results' list")
        hits = []
        for item in results[: max(k, 0)]:
            if not isinstance(item, dict) or not isinstance(item.get("title"), str):
                continue
            desc, url, score = item.get("description"), item.get("url"), item.get("score")
            hits.append(ImageHit(
                title=item["title"],
                description=desc if isinstance(desc, str) else "",
                url=url if isinstance(url, str) else "",
                score=float(score) if isinstance(score, int | float) else 0.0,
            ))
        return hits


class ImageSearchTool(BackendTool):
    """Reverse-searches ``ctx.images[call.image_index]`` and lists what it looks like."""

    name = "image_search"

    backend: ImageSearchBackend

    def __init__(self, backend: ImageSearchBackend, *, k: int = 3, max_chars: int = 1200) -> None:
        super().__init__(backend, k=k, max_chars=max_chars)

    async def __call__(self, call: ToolCall, ctx: ToolContext) -> Observation:
        pos, ref = pick_image(ctx, call.image_index)
        hits = await self.backend.search(ref, self.k)
        data: dict[str, object] = {"image": pos + 1, "hits": [asdict(h) for h in hits]}
        if not hits:
            return Observation(text=f"No visually similar images found for image {pos + 1}.", data=data)
        lines = [
            f"{h.title}: {h.description}" + (f" ({h.url})" if h.url else "") + f" [similarity {h.score:.2f}]"
            for h in hits
        ]
        header = f"Visually similar images for image {pos + 1}:"
        return Observation(text=format_hits(header, lines, self.max_chars), data=data)

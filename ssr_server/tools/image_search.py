"""Image search: reverse-search a context image, with a local perceptual-hash index or an HTTP service.

HTTP contract (``HTTPImageSearchBackend``), deliberately small so any service can be wrapped::

    POST {base_url}/search
    Content-Type: application/json
    {"image": "<base64 of PNG bytes>", "k": 3}

    200 OK
    {"results": [{"title": "Eiffel Tower", "description": "A wrought-iron lattice tower ...",
                  "url": "https://...", "score": 0.93, "thumbnail": "<base64 PNG or JPEG>"}, ...]}

``title`` is required; ``description`` and ``url`` default to ""; ``score`` is a similarity, higher is
better (0 if missing); ``thumbnail`` is optional (it goes through the same size, pixel and format checks
as a request's images; one that fails them is dropped, the hit kept). Results are expected best first;
at most ``k`` are used. Any other status, a body that is not JSON, or JSON without a ``results`` list is
a tool error.

The local index (``LocalImageIndex``) loads a folder with ``index.json``:
``{"images": [{"file", "title", "description", "url"}]}`` (the demo world writes one) and compares
images by perceptual hash, which survives resizing and JPEG recompression but not cropping. The indexed
pictures are the hits' thumbnails. An entry may carry its hashes (``"phash"`` and ``"dhash"``, the hex
strings of ``image_hashes``), so that a large index loads without decoding every picture.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import httpx
import imagehash
import numpy as np
from PIL import Image

from ssr_server.core.actions import ToolCall
from ssr_server.core.errors import ToolError
from ssr_server.core.protocol import ImageRef
from ssr_server.tools.base import Observation, SearchHit, ToolContext
from ssr_server.tools.common import BackendTool, check_status, clip, http_error, pick_image


@dataclass(frozen=True)
class ImageHit:
    """One visually similar image; ``score`` is a similarity in [0, 1], higher is better."""

    title: str
    description: str
    url: str
    score: float
    thumbnail: ImageRef | None = None


class ImageSearchBackend(Protocol):
    async def search(self, image: ImageRef, k: int) -> list[ImageHit]: ...


@dataclass(frozen=True)
class _Entry:
    hit: ImageHit
    phash: imagehash.ImageHash
    dhash: imagehash.ImageHash
    path: Path


@lru_cache(maxsize=256)
def _thumbnail(path: str) -> ImageRef:
    """An indexed picture as a hit's thumbnail (cached: a run's next search often shows it again)."""
    with Image.open(path) as img:
        return ImageRef.from_pil(img.convert("RGB"))


def _hashes(image: Image.Image) -> tuple[imagehash.ImageHash, imagehash.ImageHash]:
    rgb = image if image.mode == "RGB" else image.convert("RGB")
    return imagehash.phash(rgb), imagehash.dhash(rgb)


def image_hashes(image: Image.Image) -> tuple[str, str]:
    """The (pHash, dHash) hex strings an index entry may store as ``"phash"`` and ``"dhash"``."""
    ph, dh = _hashes(image)
    return str(ph), str(dh)


_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


def _pack(h: imagehash.ImageHash) -> np.ndarray[Any, np.dtype[np.uint8]]:
    packed: np.ndarray[Any, np.dtype[np.uint8]] = np.packbits(h.hash.reshape(-1))
    return packed


def _stored_hashes(item: dict[str, Any]) -> tuple[imagehash.ImageHash, imagehash.ImageHash] | None:
    ph, dh = item.get("phash"), item.get("dhash")
    if not (isinstance(ph, str) and isinstance(dh, str) and len(ph) == len(dh) == 16):
        return None
    try:
        return imagehash.hex_to_hash(ph), imagehash.hex_to_hash(dh)
    except ValueError:
        return None  # not hex: hash the picture instead


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
            stored = _stored_hashes(item)
            try:
                if stored is not None and path.is_file():
                    ph, dh = stored
                else:
                    with Image.open(path) as img:
                        ph, dh = _hashes(img)
            except OSError as e:
                raise ValueError(f"{index_path}: entry {n}: cannot load {path} ({e})") from None
            hit = ImageHit(item["title"], str(item.get("description", "")), str(item.get("url", "")), 0.0)
            self._entries.append(_Entry(hit, ph, dh, path))
        # Hashes packed into bytes, one row per entry: a query is an XOR and a popcount table lookup
        # over the whole index, not a Python loop over thousands of entries.
        self._bits = (self._entries[0].phash.hash.size, self._entries[0].dhash.hash.size)
        self._packed = [np.stack([_pack(e.phash) for e in self._entries]),
                        np.stack([_pack(e.dhash) for e in self._entries])]

    def __len__(self) -> int:
        return len(self._entries)

    def distance_array(self, phash: str, dhash: str) -> np.ndarray[Any, np.dtype[np.float64]]:
        """Distances from hashes (``image_hashes``) to every entry, in index order."""
        ph, dh = imagehash.hex_to_hash(phash), imagehash.hex_to_hash(dhash)
        if (ph.hash.size, dh.hash.size) != self._bits:
            raise ValueError("hash size differs from the index's")
        dp = _POPCOUNT[self._packed[0] ^ _pack(ph)].sum(axis=1, dtype=np.int64) / self._bits[0]
        dd = _POPCOUNT[self._packed[1] ^ _pack(dh)].sum(axis=1, dtype=np.int64) / self._bits[1]
        out: np.ndarray[Any, np.dtype[np.float64]] = (dp + dd) / 2
        return out

    def _ranked(self, image: Image.Image) -> list[tuple[float, _Entry]]:
        dist = self.distance_array(*image_hashes(image))
        order = np.argsort(dist, kind="stable")  # ties keep index order, as a stable sort would
        return [(float(dist[i]), self._entries[i]) for i in order]

    def distances(self, image: Image.Image) -> list[tuple[float, ImageHit]]:
        """All (distance, entry) pairs, nearest first; exposed for calibration and tests."""
        return [(d, e.hit) for d, e in self._ranked(image)]

    def _search(self, image: Image.Image, k: int) -> list[ImageHit]:
        return [
            ImageHit(e.hit.title, e.hit.description, e.hit.url, round(1.0 - d, 4), _thumbnail(str(e.path)))
            for d, e in self._ranked(image)[: max(k, 0)]
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
                thumbnail=await _decode_thumbnail(item.get("thumbnail")),
            ))
        return hits


async def _decode_thumbnail(value: object) -> ImageRef | None:
    """A result's base64 thumbnail through the request intake's checks; a bad one is dropped."""
    if not isinstance(value, str) or not value:
        return None
    from ssr_server.core.errors import InvalidRequest
    from ssr_server.core.images.intake import decode_base64, decode_image_bytes
    from ssr_server.core.images.limits import ImageLimits

    limits = ImageLimits(max_bytes=2 * 1024 * 1024, max_pixels=4_000_000)
    try:
        return await asyncio.to_thread(decode_image_bytes, decode_base64(value, limits), limits)
    except InvalidRequest:
        return None


class ImageSearchTool(BackendTool):
    """Reverse-searches ``ctx.images[call.image_index]``: the hits (title, URL, description) and their
    thumbnails, which join the run's image registry."""

    name = "image_search"

    backend: ImageSearchBackend

    def __init__(self, backend: ImageSearchBackend, *, k: int = 3, max_chars: int = 400) -> None:
        super().__init__(backend, k=k, max_chars=max_chars)

    async def __call__(self, call: ToolCall, ctx: ToolContext) -> Observation:
        pos, ref = pick_image(ctx, call.image_index)
        found = await self.backend.search(ref, self.k)
        hits = tuple(SearchHit(h.title, h.url, clip(h.description, self.max_chars), h.score, h.thumbnail)
                     for h in found)
        data: dict[str, object] = {"image": pos, "hits": [
            {"title": h.title, "url": h.url, "description": h.description, "score": h.score,
             "thumbnail": h.thumbnail is not None} for h in found]}
        return Observation(hits=hits, images=tuple(h.thumbnail for h in hits if h.thumbnail is not None),
                           data=data)

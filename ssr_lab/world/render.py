"""Rendering work, done in worker processes: an entity's index picture and its question views.

Workers write the files themselves and send back only hashes, crops and digests, so little crosses
process boundaries. Every file's bytes depend only on the entity's look, the world seed, the view
name and the attempt number, never on which worker ran it or in which order.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from ssr_lab.world.entities import Look
from ssr_lab.world.picture import draw_canvas, index_picture
from ssr_lab.world.scene import Box
from ssr_lab.world.views import Crop, make_view, view_seed
from ssr_server.tools.image_search import image_hashes


@dataclass(frozen=True)
class RenderJob:
    root: str
    seed: int
    entity_id: str
    look: Look
    canonical: bool  # draw and write images/<entity_id>.png
    views: tuple[tuple[str, int], ...]  # (view name, attempt): write views/<view name>.jpg


@dataclass(frozen=True)
class RenderedView:
    name: str
    attempt: int
    phash: str
    dhash: str
    crop: Crop
    sha256: str


@dataclass(frozen=True)
class Rendered:
    entity_id: str
    phash: str
    dhash: str
    sha256: str
    plaque_box: Box
    views: tuple[RenderedView, ...]


def write_atomic(path: Path, data: bytes) -> str:
    """Write via a temporary file and rename (readers never see half a file); returns the sha256."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return hashlib.sha256(data).hexdigest()


def render(job: RenderJob) -> Rendered:
    canvas = draw_canvas(job.look)
    picture = index_picture(canvas)
    root = Path(job.root)
    phash = dhash = digest = ""
    if job.canonical:
        buf = io.BytesIO()
        picture.save(buf, format="PNG")
        digest = write_atomic(root / "images" / f"{job.entity_id}.png", buf.getvalue())
        phash, dhash = image_hashes(picture)
    views = []
    for name, attempt in job.views:
        view = make_view(picture, view_seed(job.seed, name, attempt))
        with Image.open(io.BytesIO(view.jpeg)) as decoded:  # hash what a search will actually see
            vp, vd = image_hashes(decoded)
        sha = write_atomic(root / "views" / f"{name}.jpg", view.jpeg)
        views.append(RenderedView(name, attempt, vp, vd, view.crop, sha))
    return Rendered(job.entity_id, phash, dhash, digest, canvas.plaque_box, tuple(views))


def render_batch(jobs: list[RenderJob]) -> list[Rendered]:
    return [render(job) for job in jobs]

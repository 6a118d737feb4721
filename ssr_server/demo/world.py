"""The offline demo world: entities, their pictures, a text corpus, an image index and questions.

Everything is generated from inline Python data, so the demo runs with no network, no downloads and
the same bytes on every machine. ``build_demo_assets`` writes the files the local search backends load:

* ``corpus.jsonl``: one document per description or fact, ``{"id", "title", "text", "url"}``;
* ``images/index.json``: ``{"images": [{"id", "file", "title", "description", "url"}]}`` next to
  one PNG per entity;
* ``manifest.json``: a fingerprint of the world, so an up-to-date folder is not rewritten.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

from PIL import Image

from ssr_server.demo.draw import draw_entity
from ssr_server.demo.entities import ENTITIES, Entity

DEFAULT_SIZE = (224, 160)
WORLD_VERSION = 1  # bump when drawing code changes pixels, so stale asset folders are rebuilt

_BY_ID: dict[str, Entity] = {e.id: e for e in ENTITIES}


@dataclass(frozen=True)
class DemoQuestion:
    """A question about an entity's picture and a substring any correct answer contains.

    ``kind`` says what the agent needs: ``"search"`` questions need image search to identify the
    entity and then text search for the fact; ``"visual"`` ones are answerable from the pixels alone.
    """

    question: str
    entity_id: str
    expected_answer_substring: str
    kind: Literal["search", "visual"] = "search"


@dataclass(frozen=True)
class DemoAssets:
    """Where ``build_demo_assets`` put things."""

    root: Path
    corpus_path: Path
    image_dir: Path
    image_index_path: Path


def entities() -> list[Entity]:
    return list(ENTITIES)


def get_entity(entity_id: str) -> Entity:
    try:
        return _BY_ID[entity_id]
    except KeyError:
        raise KeyError(f"no demo entity with id {entity_id!r}") from None


@lru_cache(maxsize=64)
def _canvas(entity_id: str) -> Image.Image:
    """Drawing costs milliseconds per picture; cached because callers render the same ones repeatedly.

    Never handed out: ``render_image`` always returns a fresh resized copy, so the cache cannot be
    mutated by a caller.
    """
    return draw_entity(get_entity(entity_id))


def render_image(entity_id: str, size: tuple[int, int] = DEFAULT_SIZE) -> Image.Image:
    """The entity's picture as an RGB image of ``size``; identical pixels on every call."""
    if size[0] < 8 or size[1] < 8:
        raise ValueError(f"image size must be at least 8x8, got {size}")
    return _canvas(entity_id).resize(size, Image.Resampling.LANCZOS)


def corpus_documents() -> list[dict[str, str]]:
    """One document per description and per fact, so BM25 can rank the one fact that answers."""
    docs: list[dict[str, str]] = []
    for e in ENTITIES:
        docs.append({"id": f"{e.id}#description", "title": e.title, "text": e.description, "url": e.url})
        for i, fact in enumerate(e.facts, start=1):
            doc_id, url = f"{e.id}#fact-{i}", f"{e.url}#fact-{i}"
            docs.append({"id": doc_id, "title": e.title, "text": fact, "url": url})
    return docs


def _fingerprint() -> str:
    """Changes whenever the data or the drawing version changes."""
    h = hashlib.sha256(f"v{WORLD_VERSION}".encode())
    for e in ENTITIES:
        h.update(json.dumps(asdict(e), sort_keys=True).encode())
    return h.hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    """Write via a temporary file and rename, so concurrent builders never see half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def build_demo_assets(directory: str | os.PathLike[str], *, force: bool = False) -> DemoAssets:
    """Write the corpus, the pictures and the image index under ``directory``.

    Skips the work when the folder already holds this exact world (by fingerprint), so servers can
    call it at every start-up cheaply; ``force`` rewrites anyway.
    """
    root = Path(directory)
    image_dir = root / "images"
    assets = DemoAssets(root, root / "corpus.jsonl", image_dir, image_dir / "index.json")
    manifest = root / "manifest.json"
    fingerprint = _fingerprint()
    present = manifest.is_file() and assets.corpus_path.is_file() and assets.image_index_path.is_file()
    if present and not force:
        try:
            if json.loads(manifest.read_text()).get("fingerprint") == fingerprint:
                return assets
        except (OSError, ValueError):
            pass  # unreadable manifest: rebuild
    image_dir.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(doc, ensure_ascii=False) for doc in corpus_documents()]
    _write_atomic(assets.corpus_path, ("\n".join(lines) + "\n").encode())
    index = []
    for e in ENTITIES:
        fname = f"{e.id}.png"
        img = render_image(e.id)
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        _write_atomic(image_dir / fname, buf.getvalue())
        index.append(
            {"id": e.id, "file": fname, "title": e.title, "description": e.description, "url": e.url}
        )
    index_json = json.dumps({"images": index}, indent=1, ensure_ascii=False)
    _write_atomic(assets.image_index_path, index_json.encode())
    _write_atomic(manifest, json.dumps({"fingerprint": fingerprint, "entities": len(ENTITIES)}).encode())
    return assets


_Q = DemoQuestion
_QUESTIONS: tuple[DemoQuestion, ...] = (
    _Q("How tall is the structure in this image, in metres?", "eiffel-tower", "330"),
    _Q("In which year did the bridge in this picture open to traffic?", "golden-gate-bridge", "1937"),
    _Q("For which pharaoh was the monument in this image built?", "great-pyramid", "Khufu"),
    _Q("Who commissioned the building shown here?", "taj-mahal", "Shah Jahan"),
    _Q("Which architect designed the building in this photo?", "sydney-opera-house", "Utzon"),
    _Q("In which museum does this painting hang?", "mona-lisa", "Louvre"),
    _Q("Who painted this picture?", "starry-night", "Gogh"),
    _Q("What does the animal in this picture mostly eat?", "giant-panda", "bamboo"),
    _Q("What does this animal mainly feed on?", "blue-whale", "krill"),
    _Q("In which lake complex does this animal live in the wild?", "axolotl", "Xochimilco"),
    _Q("Which city does this dish come from?", "pizza-margherita", "Naples"),
    _Q("Which spice gives this dish its colour?", "paella", "saffron"),
    _Q("In which year did the first line of this railway network open?", "shinkansen", "1964"),
    _Q("In which year was this aircraft retired?", "concorde", "2003"),
    _Q("Which engineer built this lighthouse?", "varrow-point-lighthouse", "Tresslin"),
    _Q("How many seconds pass between flashes of this lighthouse's lamp?", "varrow-point-lighthouse", "7"),
    _Q("Who painted this picture?", "copper-orchard", "Marwen"),
    _Q("Which sculptor made the statue in this image?", "tidecaller", "Castell"),
    _Q("How many passengers can this tram seat?", "kestrel-tram", "64"),
    _Q("What is written on the front of this tram?", "kestrel-tram", "K7", "visual"),
    _Q("What letters are painted on the side of this rocket?", "saturn-v", "USA", "visual"),
    _Q("What colour is the bus in this picture?", "routemaster", "red", "visual"),
    _Q("How many trees are shown in this painting?", "copper-orchard", "12", "visual"),
)


def demo_questions() -> list[DemoQuestion]:
    return list(_QUESTIONS)

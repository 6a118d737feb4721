"""The gold moves work with the real search backends on every question of a small build."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from PIL import Image

from ssr_lab.world import Question
from ssr_server.core.protocol import ImageRef
from ssr_server.tools.image_search import LocalImageIndex, image_hashes
from ssr_server.tools.text_search import LocalBM25


async def test_image_search_finds_the_entity_of_every_view(world_root: Path,
                                                           questions: list[Question]) -> None:
    index = LocalImageIndex(world_root / "images")
    title_of = {q.image: q.entity for q in questions}
    first = 0
    for image, title in sorted(title_of.items()):
        with Image.open(world_root / image) as img:
            hits = await index.search(ImageRef.from_pil(img.convert("RGB")), 3)
        assert title in [h.title for h in hits], (image, title, hits)
        first += hits[0].title == title
    assert first == len(title_of)  # the build calibrates to rank 1, which is stricter than top 3


async def test_gold_queries_retrieve_their_documents(world_root: Path, questions: list[Question]) -> None:
    bm25 = LocalBM25.from_jsonl(world_root / "corpus.jsonl")
    checked = 0
    for q in questions:
        lookups = [m for m in q.moves if m.action == "text_search"]
        for i, m in enumerate(lookups):
            hits = await bm25.search(m.query, 5)
            assert m.expect_url in [h.url for h in hits], (q.id, m.query, hits)
            if i == len(lookups) - 1:
                assert any(q.answer in h.text for h in hits), (q.id, m.query)
            checked += 1
    assert checked > len(questions) // 3


def test_distractors_are_in_the_corpus(corpus: list[dict[str, str]]) -> None:
    assert len({d["url"] for d in corpus}) == len(corpus) == len({d["id"] for d in corpus})
    namesakes = [d for d in corpus if d["id"].endswith("#namesake")]
    assert namesakes and all("not to be confused with" in d["text"] for d in namesakes)
    stems: dict[str, set[str]] = {}
    for d in corpus:
        if "#" not in d["id"]:
            continue
        stems.setdefault(d["title"].split()[0], set()).add(d["title"])
    assert any(len(titles) > 1 for titles in stems.values())  # near-namesakes share a stem


def test_stored_hashes_equal_computed_ones(world_root: Path, tmp_path: Path) -> None:
    """index.json carries each picture's hashes; an index built without them ranks identically."""
    copy = tmp_path / "images"
    shutil.copytree(world_root / "images", copy)
    raw = json.loads((copy / "index.json").read_text())
    for item in raw["images"]:
        with Image.open(copy / item["file"]) as img:
            assert (item["phash"], item["dhash"]) == image_hashes(img)
        del item["phash"], item["dhash"]
    (copy / "index.json").write_text(json.dumps(raw))
    stored, computed = LocalImageIndex(world_root / "images"), LocalImageIndex(copy)
    probe = next((world_root / "views").glob("*.jpg"))
    with Image.open(probe) as img:
        hashes = image_hashes(img)
        ranked = [(d, h.title) for d, h in stored.distances(img)]
        assert ranked == [(d, h.title) for d, h in computed.distances(img)]
    assert (stored.distance_array(*hashes) == computed.distance_array(*hashes)).all()

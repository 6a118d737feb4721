from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import imagehash
import pytest

from ssr_server.demo import (
    build_demo_assets,
    corpus_documents,
    demo_questions,
    entities,
    get_entity,
    render_image,
)
from ssr_server.demo.entities import PALETTE
from ssr_server.demo.shapes import DRAWERS


def test_entities_are_well_formed() -> None:
    ents = entities()
    assert 30 <= len(ents) <= 40
    assert len({e.id for e in ents}) == len(ents)
    assert len({e.title for e in ents}) == len(ents)
    for e in ents:
        assert 2 <= len(e.facts) <= 4, e.id
        assert e.description and all(f.endswith(".") for f in e.facts)
        assert e.motif in DRAWERS and e.colour in PALETTE
        assert e.url.endswith(e.id) and ".invalid/" in e.url
    assert {e.category for e in ents} >= {"landmark", "animal", "artwork", "food", "vehicle"}


def test_render_is_deterministic_and_sized() -> None:
    a = render_image("eiffel-tower")
    b = render_image("eiffel-tower")
    assert a.size == (224, 160) and a.mode == "RGB"
    assert a.tobytes() == b.tobytes()
    assert render_image("koala", size=(100, 80)).size == (100, 80)
    assert render_image("koala").tobytes() != a.tobytes()


def test_render_rejects_unknown_and_tiny() -> None:
    with pytest.raises(KeyError, match="no-such"):
        render_image("no-such-entity")
    with pytest.raises(ValueError):
        render_image("koala", size=(4, 4))
    assert get_entity("koala").title == "Koala"


def test_pictures_are_perceptually_distinct() -> None:
    """Every pair must be far apart in pHash+dHash space, or reverse image search would confuse them."""
    images = {e.id: render_image(e.id) for e in entities()}
    hashes = {k: (imagehash.phash(img), imagehash.dhash(img)) for k, img in images.items()}
    for (a, (pa, da)), (b, (pb, db)) in itertools.combinations(hashes.items(), 2):
        dist = ((pa - pb) + (da - db)) / 128
        assert dist > 0.2, (a, b, dist)


def test_build_assets_writes_corpus_and_index(tmp_path: Path) -> None:
    assets = build_demo_assets(tmp_path / "w")
    lines = assets.corpus_path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == sum(1 + len(e.facts) for e in entities()) == len(corpus_documents())
    docs = [json.loads(line) for line in lines]
    assert all(set(d) == {"id", "title", "text", "url"} for d in docs)
    assert len({d["id"] for d in docs}) == len(docs)
    assert any("330 metres" in d["text"] and d["title"] == "Eiffel Tower" for d in docs)
    index = json.loads(assets.image_index_path.read_text(encoding="utf-8"))["images"]
    assert len(index) == len(entities())
    for item in index:
        assert {"file", "title", "description", "url"} <= set(item)
        assert (assets.image_dir / item["file"]).is_file()


def test_build_assets_skips_up_to_date_and_rebuilds_stale(tmp_path: Path) -> None:
    assets = build_demo_assets(tmp_path)
    png = assets.image_dir / "koala.png"
    os.utime(png, (1, 1))
    build_demo_assets(tmp_path)
    assert png.stat().st_mtime == 1  # untouched: fingerprint matched
    build_demo_assets(tmp_path, force=True)
    assert png.stat().st_mtime > 1
    os.utime(png, (1, 1))
    (tmp_path / "manifest.json").write_text('{"fingerprint": "old"}')
    build_demo_assets(tmp_path)
    assert png.stat().st_mtime > 1


def test_demo_questions_are_answerable_from_the_world() -> None:
    qs = demo_questions()
    assert 18 <= len(qs) <= 30
    assert {q.kind for q in qs} == {"search", "visual"}
    for q in qs:
        e = get_entity(q.entity_id)
        want = q.expected_answer_substring.lower()
        knowledge = " ".join((e.description, *e.facts)).lower()
        if q.kind == "search":
            assert want in knowledge, q
        else:
            assert want in f"{e.label} {e.colour} {knowledge}".lower(), q

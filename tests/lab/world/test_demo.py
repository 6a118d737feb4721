"""The demo world: the small fixed preset, reused when current, with its headline question."""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image

from ssr_lab.world import (
    demo_documents,
    demo_entities,
    demo_questions,
    demo_world,
    drawn_demo_picture,
    showcase_question,
)
from ssr_lab.world.demo import DEMO_ENTITIES
from ssr_lab.world.records import FROM_EVIDENCE, IDENTIFY, LOOKUP
from ssr_server.core.protocol import ImageRef
from ssr_server.tools.registry import build_registry


async def test_demo_world_builds_once_and_serves_its_showcase(tmp_path: Path) -> None:
    world = demo_world(tmp_path / "demo")
    stamp = world.image_index_path.stat().st_mtime_ns
    assert demo_world(tmp_path / "demo").image_index_path.stat().st_mtime_ns == stamp  # reused, not rebuilt
    questions = demo_questions(world)
    entities = demo_entities()
    assert len([e for e in entities if not e.knowledge]) == DEMO_ENTITIES
    assert {q.entity_id for q in questions} <= {e.id for e in entities}
    q = showcase_question(questions)
    assert [m.move for m in q.moves] == [IDENTIFY, LOOKUP, FROM_EVIDENCE]
    assert q.entity not in q.question
    registry = build_registry(corpus_path=world.corpus_path, image_index_dir=world.image_dir)
    assert set(registry.names) == {"zoom", "text_search", "image_search"}
    image_index = registry.get("image_search").backend  # type: ignore[union-attr]
    hits = await image_index.search(ImageRef.from_pil(world.question_image(q)), 3)
    assert hits[0].title == q.entity
    text = registry.get("text_search").backend  # type: ignore[union-attr]
    found = await text.search(q.moves[1].query, 5)
    assert any(q.answer in h.text for h in found)
    assert world.picture(q.entity_id).tobytes() == drawn_demo_picture(q.entity_id).tobytes()
    assert world.corpus_path.read_text().splitlines() == [json.dumps(d, ensure_ascii=False)
                                                           for d in demo_documents()]


def test_forced_rebuild_rewrites_the_same_bytes(tmp_path: Path) -> None:
    world = demo_world(tmp_path / "demo")
    before = world.questions_path.read_bytes(), world.image_index_path.read_bytes()
    world.questions_path.write_text("stale")
    again = demo_world(tmp_path / "demo", force=True)
    assert (again.questions_path.read_bytes(), again.image_index_path.read_bytes()) == before


def test_world_entities_regenerates_a_built_worlds_entities_from_its_manifest(world_dir: Path,
                                                                             tmp_path: Path) -> None:
    import pytest

    from ssr_lab.world.build import world_entities
    from ssr_lab.world.picture import draw_canvas, index_picture
    from ssr_lab.world.records import WorldError

    entities = world_entities(world_dir)
    assert entities == demo_entities()
    on_disk = {q.entity_id for q in demo_questions(demo_world(world_dir))}
    e = next(e for e in entities if e.id in on_disk)
    with Image.open(world_dir / "images" / f"{e.id}.png") as img:  # the looks are the ones drawn
        assert img.convert("RGB").tobytes() == index_picture(draw_canvas(e.look)).tobytes()
    stale = tmp_path / "stale"
    stale.mkdir()
    manifest = json.loads((world_dir / "manifest.json").read_text())
    (stale / "manifest.json").write_text(json.dumps({**manifest, "world_version": -1}))
    with pytest.raises(WorldError, match="rebuild"):
        world_entities(stale)


def test_the_shipped_demo_world_is_what_the_lab_builds(tmp_path: Path) -> None:
    """``ssr-lab world build --preset demo`` gives the very files the server ships (same fingerprint), and
    the shipped files are the ones their manifest fingerprints (none edited by hand)."""
    from typer.testing import CliRunner

    from ssr_lab.cli import app
    from ssr_server.tools.demo import folder_fingerprint, shipped_demo_world

    shipped = shipped_demo_world()
    assert folder_fingerprint(shipped.root) == shipped.manifest["fingerprint"]
    result = CliRunner().invoke(app, ["world", "build", str(tmp_path / "demo"), "--preset", "demo"])
    assert result.exit_code == 0, result.output
    rebuilt = json.loads((tmp_path / "demo" / "manifest.json").read_text())
    assert rebuilt["fingerprint"] == shipped.manifest["fingerprint"]
    assert rebuilt == shipped.manifest
    assert folder_fingerprint(tmp_path / "demo") == rebuilt["fingerprint"]

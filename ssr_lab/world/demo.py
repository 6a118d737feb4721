"""The demo preset of the benchmark world (36 invented entities, fixed seed): what the server ships.

``ssr-lab world build --preset demo DIR`` writes it; the server keeps the result as package data
(``ssr_server/tools/demo_world``) and a test checks that a fresh build has the shipped fingerprint. It
builds in about a second; a folder that already holds this exact preset (by its manifest) is reused as
is. Builds are deterministic and every file is written atomically, manifest last, so concurrent builders
of the same folder are harmless.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from PIL import Image

from ssr_lab.world.build import WORLD_VERSION, build_world
from ssr_lab.world.corpus import build_corpus
from ssr_lab.world.entities import Entity, generate_entities
from ssr_lab.world.knowledge import knowledge_entities, knowledge_words
from ssr_lab.world.names import fixed_names
from ssr_lab.world.picture import draw_canvas, index_picture
from ssr_lab.world.records import Question, load_questions
from ssr_server.tools.demo import DemoWorld

DEMO_SEED = 20_260_105  # chosen so that its showcase reads "How tall is this landmark?"
DEMO_ENTITIES = 36


def _is_current(root: Path) -> bool:
    try:
        m = json.loads((root / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    recipe = (m.get("world_version"), m.get("seed"), m.get("entities"))
    files = (root / "corpus.jsonl", root / "images" / "index.json", root / "questions.jsonl")
    return recipe == (WORLD_VERSION, DEMO_SEED, DEMO_ENTITIES) and all(f.is_file() for f in files)


def demo_world(directory: str | os.PathLike[str], *, force: bool = False) -> DemoWorld:
    """Build the demo world into ``directory`` unless it is already there (``force`` rebuilds)."""
    root = Path(directory)
    if force or not _is_current(root):
        build_world(root, DEMO_ENTITIES, DEMO_SEED, processes=1)
    return DemoWorld(root)


def demo_entities() -> list[Entity]:
    """The demo world's entities (knowledge ones first), computed without touching any file."""
    names = fixed_names()
    return knowledge_entities() + generate_entities(DEMO_ENTITIES, DEMO_SEED, names, knowledge_words())


def drawn_demo_picture(entity_id: str) -> Image.Image:
    """An entity's index picture drawn afresh: the same pixels as ``images/<id>.png`` of a build."""
    for e in demo_entities():
        if e.id == entity_id:
            return index_picture(draw_canvas(e.look))
    raise KeyError(f"no demo entity with id {entity_id!r}")


def demo_documents() -> list[dict[str, str]]:
    """The demo corpus computed without building any file: the lines of ``corpus.jsonl``."""
    return build_corpus(demo_entities(), fixed_names().people, DEMO_SEED)


def demo_questions(world: DemoWorld) -> list[Question]:
    """The full question records (gold moves included) of a world folder."""
    return load_questions(world.questions_path)

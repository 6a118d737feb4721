"""The demo world: a small fixed preset of the procedural world (36 invented entities, fixed seed).

It builds in about a second, so a server can call ``demo_world`` at every start-up; a folder that
already holds this exact preset (by its manifest) is reused as is. Builds are deterministic and every
file is written atomically, manifest last, so concurrent builders of the same folder are harmless.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from ssr_server.world.build import WORLD_VERSION, build_world
from ssr_server.world.corpus import build_corpus
from ssr_server.world.entities import Entity, generate_entities
from ssr_server.world.knowledge import knowledge_entities, knowledge_words
from ssr_server.world.names import fixed_names
from ssr_server.world.picture import draw_canvas, index_picture
from ssr_server.world.records import Question, load_questions

DEMO_SEED = 20_260_105  # chosen so that its showcase reads "How tall is this landmark?"
DEMO_ENTITIES = 36


@dataclass(frozen=True)
class DemoWorld:
    """Where the demo world's files are; ``corpus_path`` and ``image_dir`` go to ``build_registry``."""

    root: Path

    @property
    def corpus_path(self) -> Path:
        return self.root / "corpus.jsonl"

    @property
    def image_dir(self) -> Path:
        return self.root / "images"

    @property
    def image_index_path(self) -> Path:
        return self.image_dir / "index.json"

    @property
    def questions_path(self) -> Path:
        return self.root / "questions.jsonl"

    def picture(self, entity_id: str) -> Image.Image:
        """An entity's index picture (224x160 RGB), as image search shows it."""
        path = self.image_dir / f"{entity_id}.png"
        if not path.is_file():
            raise KeyError(f"no entity {entity_id!r} in the world at {self.root}")
        with Image.open(path) as img:
            return img.convert("RGB")

    def question_image(self, question: Question) -> Image.Image:
        """A question's image (a perturbed view of its entity's picture)."""
        with Image.open(self.root / question.image) as img:
            return img.convert("RGB")


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


def demo_picture(entity_id: str) -> Image.Image:
    """An entity's index picture without building any file: the same pixels as ``images/<id>.png``."""
    for e in demo_entities():
        if e.id == entity_id:
            return index_picture(draw_canvas(e.look))
    raise KeyError(f"no demo entity with id {entity_id!r}")


def demo_documents() -> list[dict[str, str]]:
    """The demo corpus without building any file: the lines of ``corpus.jsonl``."""
    return build_corpus(demo_entities(), fixed_names().people, DEMO_SEED)


def demo_questions(world: DemoWorld) -> list[Question]:
    return load_questions(world.questions_path)


def showcase_question(questions: list[Question]) -> Question:
    """The demo's headline question: a landmark's height from its picture alone, which needs an image
    search (what is it?) and then a text search (how tall is it?)."""
    found = [q for q in questions
             if q.kind == "search" and q.category == "landmark" and q.attribute == "height"]
    if not found:
        raise LookupError("the world has no landmark-height search question")
    return min(found, key=lambda q: "landmark" not in q.question)  # "this landmark" says least

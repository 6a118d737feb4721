"""The demo world, shipped prebuilt in the package: what ``serve`` searches when no backend is set.

A small fixed preset of the lab's benchmark world (36 invented entities and 31 well-known ones, their
index pictures, a 533-document corpus, 168 questions with their images), built by
``ssr-lab world build --preset demo`` and kept here as package data (about 1.3 MB), so the server builds
nothing and imports no builder at start-up. ``manifest.json`` holds the fingerprint of every other file;
a test rebuilds the preset with the lab and checks the two are the same world.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from PIL import Image

DEMO_DIR = Path(__file__).resolve().parent / "demo_world"
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class DemoWorld:
    """Where a world folder's files are; ``corpus_path`` and ``image_dir`` go to ``build_registry``."""

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

    @property
    def manifest(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.root / MANIFEST).read_text(encoding="utf-8"))
        return data

    def entity_ids(self) -> list[str]:
        """The entities with an index picture, in the image index's order (well-known ones first)."""
        index = json.loads(self.image_index_path.read_text(encoding="utf-8"))
        return [str(item["id"]) for item in index["images"]]

    def picture(self, entity_id: str) -> Image.Image:
        """An entity's index picture (224x160 RGB), as image search shows it."""
        path = self.image_dir / f"{entity_id}.png"
        if not path.is_file():
            raise KeyError(f"no entity {entity_id!r} in the world at {self.root}")
        with Image.open(path) as img:
            return img.convert("RGB")

    def question_image(self, question: HasImage) -> Image.Image:
        """A question's image (a perturbed view of its entity's picture)."""
        with Image.open(self.root / question.image) as img:
            return img.convert("RGB")

    def documents(self) -> list[dict[str, str]]:
        """The corpus, one dict a line of ``corpus.jsonl``."""
        with self.corpus_path.open(encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]

    def questions(self) -> list[DemoQuestion]:
        """The questions as the server needs them (the lab reads the full records, gold moves included)."""
        with self.questions_path.open(encoding="utf-8") as f:
            return [DemoQuestion.from_json(json.loads(line)) for line in f if line.strip()]


class HasImage(Protocol):
    @property
    def image(self) -> str: ...


class Askable(Protocol):
    @property
    def kind(self) -> str: ...
    @property
    def category(self) -> str: ...
    @property
    def attribute(self) -> str: ...
    @property
    def question(self) -> str: ...


@dataclass(frozen=True)
class DemoQuestion:
    """A question of the demo world: what a client asks, about which picture, and the right answer."""

    id: str
    split: str
    kind: str
    question: str
    image: str  # relative to the world folder
    entity_id: str
    entity: str  # the entity's title
    category: str
    attribute: str
    answer: str
    aliases: tuple[str, ...]
    moves: tuple[Mapping[str, Any], ...]  # the gold moves as written: {"move", "action", its argument}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> DemoQuestion:
        return cls(id=d["id"], split=d["split"], kind=d["kind"], question=d["question"], image=d["image"],
                   entity_id=d["entity_id"], entity=d["entity"], category=d["category"],
                   attribute=d["attribute"], answer=d["answer"], aliases=tuple(d["aliases"]),
                   moves=tuple(d["moves"]))


Q = TypeVar("Q", bound=Askable)


def showcase_question(questions: Sequence[Q]) -> Q:
    """The demo's headline question: a landmark's height from its picture alone, which needs an image
    search (what is it?) and then a text search (how tall is it?)."""
    found = [q for q in questions
             if q.kind == "search" and q.category == "landmark" and q.attribute == "height"]
    if not found:
        raise LookupError("the world has no landmark-height search question")
    return min(found, key=lambda q: "landmark" not in q.question)  # "this landmark" says least


def shipped_demo_world() -> DemoWorld:
    """The demo world in the package (read-only: nothing is ever written there)."""
    return DemoWorld(DEMO_DIR)


def demo_picture(entity_id: str) -> Image.Image:
    """An entity's index picture from the shipped demo world."""
    return shipped_demo_world().picture(entity_id)


def fingerprint(digests: Mapping[str, str]) -> str:
    """One hash over every file's path and sha256, in path order (a world build's ``fingerprint``)."""
    h = hashlib.sha256()
    for path in sorted(digests):
        h.update(f"{path}\t{digests[path]}\n".encode())
    return h.hexdigest()


def folder_fingerprint(root: Path) -> str:
    """The fingerprint of a world folder's files as they are on disk (the manifest left out)."""
    digests = {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
               for p in root.rglob("*") if p.is_file() and p.name != MANIFEST}
    return fingerprint(digests)

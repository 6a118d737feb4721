"""A small world built once per session (120 invented entities), and helpers to read it."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from ssr_lab.world import BuildReport, Question, build_world, load_questions

SMALL_N = 120
SMALL_SEED = 11


def _file_digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="session")
def file_digests() -> Callable[[Path], dict[str, str]]:
    """sha256 of every file under a folder, by relative path."""
    return _file_digests


@pytest.fixture(scope="session")
def small_recipe() -> tuple[int, int]:
    """(entities, seed) of the session's small world."""
    return SMALL_N, SMALL_SEED


@pytest.fixture(scope="session")
def small_world(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, BuildReport]:
    root = tmp_path_factory.mktemp("world") / "small"
    return root, build_world(root, SMALL_N, SMALL_SEED)


@pytest.fixture(scope="session")
def world_root(small_world: tuple[Path, BuildReport]) -> Path:
    return small_world[0]


@pytest.fixture(scope="session")
def questions(world_root: Path) -> list[Question]:
    return load_questions(world_root / "questions.jsonl")


@pytest.fixture(scope="session")
def corpus(world_root: Path) -> list[dict[str, str]]:
    with (world_root / "corpus.jsonl").open() as f:
        return [json.loads(line) for line in f]

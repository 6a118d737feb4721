"""The procedural benchmark world: invented entities, pictures, a corpus and questions with gold moves.

``build_world(dir, entities, seed)`` writes a folder that the local search tools serve unchanged
(``build_registry(corpus_path=dir/"corpus.jsonl", image_index_dir=dir/"images")``) plus the question
images (``views/``) and the questions of every kind with their gold move sequences
(``questions.jsonl``, read back with ``load_questions``). ``demo_world`` is its small fixed preset.
"""

from ssr_server.world.answers import is_correct, normalise_answer
from ssr_server.world.build import build_world
from ssr_server.world.demo import (
    DemoWorld,
    demo_documents,
    demo_entities,
    demo_picture,
    demo_questions,
    demo_world,
    showcase_question,
)
from ssr_server.world.entities import Entity
from ssr_server.world.records import KIND_MOVES, KINDS, SPLITS, Move, Question, WorldError, load_questions
from ssr_server.world.report import BuildReport

__all__ = [
    "KINDS",
    "KIND_MOVES",
    "SPLITS",
    "BuildReport",
    "DemoWorld",
    "Entity",
    "Move",
    "Question",
    "WorldError",
    "build_world",
    "demo_documents",
    "demo_entities",
    "demo_picture",
    "demo_questions",
    "demo_world",
    "is_correct",
    "load_questions",
    "normalise_answer",
    "showcase_question",
]

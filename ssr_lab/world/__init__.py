"""The procedural benchmark world: invented entities, pictures, a corpus and questions with gold moves.

``build_world(dir, entities, seed)`` writes a folder that the server's local search tools serve unchanged
(``build_registry(corpus_path=dir/"corpus.jsonl", image_index_dir=dir/"images")``) plus the question
images (``views/``) and the questions of every kind with their gold move sequences
(``questions.jsonl``, read back with ``load_questions``). ``demo_world`` builds its small fixed preset,
the one the server ships.
"""

from ssr_lab.world.build import build_world
from ssr_lab.world.demo import (
    demo_documents,
    demo_entities,
    demo_questions,
    demo_world,
    drawn_demo_picture,
)
from ssr_lab.world.entities import Entity
from ssr_lab.world.records import KIND_MOVES, KINDS, SPLITS, Move, Question, WorldError, load_questions
from ssr_lab.world.report import BuildReport
from ssr_server.core.answers import is_correct, normalise_answer
from ssr_server.tools.demo import DemoWorld, showcase_question

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
    "demo_questions",
    "demo_world",
    "drawn_demo_picture",
    "is_correct",
    "load_questions",
    "normalise_answer",
    "showcase_question",
]

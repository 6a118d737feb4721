"""An offline, deterministic demo world for the search tools: entities, pictures, corpus, questions."""

from ssr_server.demo.entities import Entity
from ssr_server.demo.world import (
    DemoAssets,
    DemoQuestion,
    build_demo_assets,
    corpus_documents,
    demo_questions,
    entities,
    get_entity,
    render_image,
)

__all__ = [
    "DemoAssets",
    "DemoQuestion",
    "Entity",
    "build_demo_assets",
    "corpus_documents",
    "demo_questions",
    "entities",
    "get_entity",
    "render_image",
]

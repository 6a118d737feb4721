"""Shared fixtures of the embedded-engine tests: ONE tiny Qwen3-VL per session, loaded once.

The tiny model (trained byte-level BPE, ~1M parameters, seed 0) is built into the session's temp dir
in well under a second and loaded once in fp32; each test module or test gets its own cheap
``ModelRunner`` / ``TorchEngine`` around that one ``LoadedModel``, so prefix-cache state never leaks
between tests that care about it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from ssr_server.engine.base import Context, ImageRef
from ssr_server.engine.tiny import build_tiny_model
from ssr_server.engine.torch.engine import TorchEngine
from ssr_server.engine.torch.loader import LoadedModel, load_model
from ssr_server.engine.torch.prefix_cache import PrefixCache
from ssr_server.engine.torch.runner import ModelRunner

SYSTEM = "You are a visual search assistant. Tools: image_search, text_search, zoom. Think, then act."

CANDIDATE_TEXTS = (
    "I do not yet know what this object is, so searching with the image should identify it.\n",
    "Zoom in.\n",
    "The evidence gathered so far answers the question, so I can answer now.\n",
    "I know what the entity is, but I need a specific fact, so a text search should find it.\n",
)


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """The tiny model's ops are far too small to split: one intra-op thread is ~10x faster than two
    on a busy 2-core machine (OpenMP workers spin waiting for each other)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def lm(tiny_dir: Path) -> LoadedModel:
    return load_model(str(tiny_dir), dtype="fp32")


@pytest.fixture(scope="session")
def tok(lm: LoadedModel) -> Any:
    return lm.tokenizer


def _pattern_image(width: int, height: int, seed: int) -> ImageRef:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    return ImageRef.from_pil(Image.fromarray(pixels, mode="RGB"))


@pytest.fixture(scope="session")
def images() -> tuple[ImageRef, ImageRef, ImageRef]:
    """Three distinct images of different shapes (35, 12 and 35 merged tokens with the tiny processor)."""
    return (_pattern_image(224, 160, 1), _pattern_image(96, 128, 2), _pattern_image(224, 160, 3))


def chat_context(tok: Any, question: str, images: tuple[ImageRef, ...] = (),
                 interleave: bool = False) -> Context:
    """System + user turn + ``<think>`` opening; images up front, or each followed by a caption."""
    content: list[dict[str, str]] = []
    for i, _ in enumerate(images):
        content.append({"type": "image"})
        if interleave:
            content.append({"type": "text", "text": f"Image {i + 1}. "})
    content.append({"type": "text", "text": question})
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + "<think>\n"
    return Context(tuple(tok.encode(text, add_special_tokens=False)), tuple(images))


@pytest.fixture(scope="session")
def make_context(tok: Any) -> Callable[..., Context]:
    """``make_context(question, images=(), interleave=False)``: a chat context for the tiny tokenizer."""
    return functools.partial(chat_context, tok)


@pytest.fixture(scope="session")
def contexts(tok: Any, images: tuple[ImageRef, ImageRef, ImageRef]) -> dict[str, Context]:
    return {
        "text": chat_context(tok, "The Eiffel Tower is in Paris. How tall is it?"),
        "image": chat_context(tok, "What is the name of this landmark?", images[:1]),
        "two_images": chat_context(tok, "Compare the first image. Which country is the second one from?",
                                   images[:2], interleave=True),
    }


@pytest.fixture(scope="session")
def candidates(tok: Any) -> list[list[int]]:
    """Candidates of clearly different lengths (the second one is short)."""
    return [list(tok.encode(t, add_special_tokens=False)) for t in CANDIDATE_TEXTS]


@pytest.fixture
def runner(lm: LoadedModel) -> ModelRunner:
    """A runner with an empty prefix cache (per test)."""
    return ModelRunner(lm, PrefixCache(1 << 28))


@pytest.fixture
def fresh_engine(lm: LoadedModel) -> Iterator[TorchEngine]:
    """An engine with an empty prefix cache around the session's model (per test)."""
    engine = TorchEngine(lm)
    yield engine
    engine.scheduler.close()


@pytest.fixture(scope="module")
def engine(lm: LoadedModel) -> Iterator[TorchEngine]:
    """An engine shared by a module's tests (its prefix cache is warm across them)."""
    engine = TorchEngine(lm)
    yield engine
    engine.scheduler.close()

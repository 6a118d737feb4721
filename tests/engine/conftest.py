"""Shared fixtures of the embedded-engine tests: ONE tiny Qwen3-VL per session, loaded once.

The tiny model (trained byte-level BPE, ~1M parameters, seed 0) is built into the session's temp dir
in well under a second and loaded once in fp32; each test module or test gets its own cheap
``ModelRunner`` / ``TorchEngine`` around that one ``LoadedModel``, so prefix-cache state never leaks
between tests that care about it.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from ssr_server.core.protocol import Context, ImageRef
from ssr_server.engine.torch.config import EngineConfig
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


@pytest.fixture(scope="session")
def tiny_dir(tiny_model_dir: Path) -> Path:
    return tiny_model_dir  # the suite's one tiny model (tests/conftest.py)


@pytest.fixture(scope="session")
def lm(tiny_dir: Path) -> LoadedModel:
    return load_model(str(tiny_dir))


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


# In a fresh interpreter under HF_HUB_OFFLINE=1 (read when huggingface_hub is imported, so it cannot be
# switched on in this process): build the real-vocabulary tiny model (~8 s, mostly converting the 151,643
# ranks), then load it and the session's trained-vocabulary model with the Auto classes.
_OFFLINE_PROBE = textwrap.dedent("""
    import json, sys
    import torch
    from ssr_server.engine.tiny import build_tiny_model
    build_tiny_model(sys.argv[2], seed=0, vocab="qwen")
    from PIL import Image
    from transformers import (AutoConfig, AutoImageProcessor, AutoModelForImageTextToText,
                              AutoTokenizer)
    from huggingface_hub import constants
    out = {"offline": bool(constants.HF_HUB_OFFLINE)}
    for path in sys.argv[1:]:
        config = AutoConfig.from_pretrained(path)
        model = AutoModelForImageTextToText.from_pretrained(path).eval()
        tok = AutoTokenizer.from_pretrained(path)
        proc = AutoImageProcessor.from_pretrained(path, backend="pil")
        px = proc(images=[Image.new("RGB", (224, 160), (10, 200, 30))], return_tensors="pt")
        text = tok.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}],
            tokenize=False, add_generation_prompt=True)
        n = int(px["image_grid_thw"].prod()) // 4
        ids = tok.encode(text.replace("<|image_pad|>", "<|image_pad|>" * n))
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids]), pixel_values=px["pixel_values"],
                           image_grid_thw=px["image_grid_thw"],
                           mm_token_type_ids=(torch.tensor([ids]) == config.image_token_id).int()).logits
        out[path] = {
            "class": type(model).__name__,
            "vocab_size": config.text_config.vocab_size,
            "len_tok": len(tok),
            "ids": {k: getattr(config, k) for k in ("image_token_id", "video_token_id",
                                                    "vision_start_token_id", "vision_end_token_id")},
            "tok_ids": {t: tok.convert_tokens_to_ids(t) for t in
                        ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>",
                         "<|im_end|>", "<|endoftext|>")},
            "eos": tok.eos_token, "hello": tok.encode("Hello world"),
            "template": text, "grid": px["image_grid_thw"].tolist(),
            "logits_shape": list(logits.shape), "finite": bool(torch.isfinite(logits).all()),
        }
    print(json.dumps(out))
""")


class OfflineProbe:
    """The probe above, running in the background while other tests run (it is mostly single-threaded)."""

    def __init__(self, trained_dir: Path, qwen_dir: Path, logs: Path) -> None:
        self.qwen_dir = qwen_dir
        self._out, self._err = logs / "probe.out", logs / "probe.err"
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
        with self._out.open("w") as out, self._err.open("w") as err:
            self.proc = subprocess.Popen([sys.executable, "-c", _OFFLINE_PROBE, str(trained_dir),
                                          str(qwen_dir)], env=env, stdout=out, stderr=err)

    def result(self, timeout: float = 300) -> dict[str, Any]:
        rc = self.proc.wait(timeout)
        assert rc == 0, self._err.read_text()[-4000:]
        out: dict[str, Any] = json.loads(self._out.read_text().strip().splitlines()[-1])
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="session")
def offline_probe(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OfflineProbe]:
    logs = tmp_path_factory.mktemp("probe")
    probe = OfflineProbe(tiny_dir, logs / "tiny-qwen", logs)
    yield probe
    probe.stop()


@pytest.fixture(scope="session", autouse=True)
def _start_offline_probe_early(request: pytest.FixtureRequest) -> None:
    """Start the probe with the session when any selected test needs it, so it overlaps other tests."""
    if any("offline_probe" in getattr(item, "fixturenames", ()) for item in request.session.items):
        request.getfixturevalue("offline_probe")


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


@pytest.fixture
def make_engine(lm: LoadedModel) -> Iterator[Callable[..., TorchEngine]]:
    """Engines over the session's tiny model, driven step by step by the test (``start=False``)."""
    made: list[TorchEngine] = []

    def make(**config: Any) -> TorchEngine:
        engine = TorchEngine(lm, EngineConfig(**config), start=False)
        made.append(engine)
        return engine

    yield make
    for e in made:
        e.scheduler.close()

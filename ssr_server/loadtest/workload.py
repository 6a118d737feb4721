"""The requests a load sends: request ``i`` of a seed is always the same mode, question, picture and seed.

Questions and pictures come from the offline demo world, so the same seed sends the same bytes.
"""

from __future__ import annotations

import base64
import io
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PlannedRequest:
    index: int
    mode: str
    question: str
    entity_id: str
    with_image: bool
    body: dict[str, Any]


def _normalise_modes(modes: Mapping[str, float]) -> tuple[list[str], list[float]]:
    names = [m for m, w in modes.items() if w > 0]
    weights = [float(modes[m]) for m in names]
    if not names or not all(math.isfinite(w) for w in weights):
        raise ValueError(f"modes must give at least one mode a positive finite weight, got {dict(modes)}")
    unknown = [m for m in names if m not in ("ssr", "freeform")]
    if unknown:
        raise ValueError(f"unknown mode(s) {unknown}; the server knows 'ssr' and 'freeform'")
    return names, weights


_IMAGE_CACHE: dict[str, str] = {}


def demo_image_b64(entity_id: str) -> str:
    """The demo world's picture of ``entity_id`` as base64 PNG (encoded once per process)."""
    hit = _IMAGE_CACHE.get(entity_id)
    if hit is None:
        from ssr_server.tools.demo import demo_picture

        buf = io.BytesIO()
        demo_picture(entity_id).save(buf, format="PNG")
        hit = _IMAGE_CACHE[entity_id] = base64.b64encode(buf.getvalue()).decode("ascii")
    return hit


def _demo_questions() -> list[tuple[str, str]]:
    """(question, entity id) of the shipped demo world's questions about a picture."""
    from ssr_server.tools.demo import shipped_demo_world

    return [(q.question, q.entity_id) for q in shipped_demo_world().questions() if q.kind != "named"]


class Workload:
    """Request ``i`` of a seed is always the same mode, question, image and sampling seed."""

    def __init__(self, modes: Mapping[str, float], with_images: float, max_turns: int, seed: int,
                 tau: float = 1.0, extra: Mapping[str, Any] | None = None) -> None:
        if not 0.0 <= with_images <= 1.0:
            raise ValueError("with_images must lie in [0, 1]")
        self.mode_names, self.mode_weights = _normalise_modes(modes)
        self.with_images, self.max_turns, self.seed, self.tau = with_images, max_turns, seed, tau
        self.extra = dict(extra or {})
        self.questions = _demo_questions()

    def request(self, index: int) -> PlannedRequest:
        rng = random.Random(self.seed * 1_000_003 + index)
        mode = rng.choices(self.mode_names, self.mode_weights)[0]
        question, entity = rng.choice(self.questions)
        with_image = rng.random() < self.with_images
        body: dict[str, Any] = {"question": question, "mode": mode, "max_turns": self.max_turns,
                                "tau": self.tau, "seed": rng.randrange(2**31)}
        if with_image:
            body["images"] = [demo_image_b64(entity)]
        body.update(self.extra)
        return PlannedRequest(index, mode, question, entity, with_image, body)

"""The engine protocol and the plain records it trades.

A ``Context`` is *compact*: its token ids hold exactly ONE image-pad token per image (between the
vision start/end tokens), in the order of ``images``. Each engine expands it the way its runtime wants:
the embedded engine runs the image processor and repeats the pad token once per merged patch; SGLang
takes one pad per image plus ``image_data`` and expands it itself. This keeps the agent layer free of
patch arithmetic and lets one context travel to either engine unchanged.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from PIL import Image


@dataclass(frozen=True)
class ImageRef:
    """A decoded, validated RGB image and a digest that identifies its pixels (for cache keys)."""

    image: Image.Image
    digest: str

    @classmethod
    def from_pil(cls, image: Image.Image) -> ImageRef:
        rgb = image if image.mode == "RGB" else image.convert("RGB")
        h = hashlib.blake2b(digest_size=16)
        h.update(f"{rgb.width}x{rgb.height}".encode())
        h.update(rgb.tobytes())
        return cls(image=rgb, digest=h.hexdigest())

    def png_bytes(self) -> bytes:
        buf = io.BytesIO()
        self.image.save(buf, format="PNG")
        return buf.getvalue()


@dataclass(frozen=True)
class Context:
    token_ids: tuple[int, ...]
    images: tuple[ImageRef, ...] = ()

    def __len__(self) -> int:
        return len(self.token_ids)

    def extend(self, token_ids: Sequence[int], images: Sequence[ImageRef] = ()) -> Context:
        return Context(self.token_ids + tuple(token_ids), self.images + tuple(images))


@dataclass(frozen=True)
class CandidateScore:
    """Teacher-forced log-probabilities of one candidate's tokens given the context."""

    token_logprobs: tuple[float, ...]
    cached_tokens: int = 0  # context tokens the engine did not have to recompute
    context_tokens: int = 0  # context length as the engine counts it (images expanded)

    @property
    def logprob_sum(self) -> float:
        return float(sum(self.token_logprobs))

    @property
    def num_tokens(self) -> int:
        return len(self.token_logprobs)


FinishReason = Literal["stop", "length", "eos"]


@dataclass(frozen=True)
class Grammar:
    """A constraint on generated text, in the forms SGLang's sampling parameters take.

    ``kind`` is ``json_schema`` (``source`` is the schema as JSON text, canonical whitespace: no
    optional spaces or newlines between JSON tokens), ``ebnf`` (xgrammar's EBNF with a ``root`` rule)
    or ``regex``. Engines mask every token that would leave the language and finish the generation
    (``finish_reason`` ``"stop"``, ``stop_text`` None) as soon as the text is complete, i.e. when no
    token but end-of-sequence is allowed; the end-of-sequence token itself is not returned.
    """

    kind: Literal["json_schema", "ebnf", "regex"]
    source: str


@dataclass(frozen=True)
class GenerationParams:
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False  # benchmarks: decode exactly max_new_tokens
    grammar: Grammar | None = None  # constrained decoding (tool-call arguments, answers)
    # Text forced at the start of the output (already part of the prompt); stop strings are searched
    # only in the generated text after it.


@dataclass(frozen=True)
class Generation:
    token_ids: tuple[int, ...]
    text: str  # decoded, cut before the stop string (the stop string itself is in ``stop_text``)
    finish_reason: FinishReason
    prompt_tokens: int
    cached_tokens: int
    elapsed_s: float
    stop_text: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    # Decode forwards after the prompt's prefill (fewer than tokens with jump-forward and speculation;
    # 0 where an engine cannot tell)
    forwards: int = 0


@runtime_checkable
class Engine(Protocol):
    """What the agent layer needs from a model runtime."""

    @property
    def name(self) -> str: ...

    @property
    def tokenizer(self) -> Any:  # a Hugging Face tokenizer (encode / decode / chat template)
        ...

    async def score(
        self, context: Context, candidates: Sequence[Sequence[int]]
    ) -> list[CandidateScore]: ...

    async def generate(self, context: Context, params: GenerationParams) -> Generation: ...

    async def ready(self) -> bool: ...

    async def close(self) -> None: ...


"""The embedded engine's one frozen configuration (nano-vllm's ``Config``, mini-sglang's ``EngineConfig``).

Everything the engine's layers need to know that is not the model itself: where it runs, how big a
forward may get, how a long prefill is paced against other runs' decoding, how much KV the prefix
cache keeps, and how long a context may be. ``from_settings`` maps the ``SSR_*`` settings onto it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ssr_server.core.errors import EngineError

if TYPE_CHECKING:
    from ssr_server.core.config import Settings

Bf16Matmul = Literal["auto", "native", "fp32"]


@dataclass(frozen=True, slots=True)
class EngineConfig:
    device: str = "cpu"  # any torch device string: cpu, cuda, cuda:1, ...
    dtype: str = "fp32"  # fp32 | bf16 | fp16
    # Budgets of one forward. A score job (all its candidates) or an image is never split, so one
    # of them larger than the token budget still runs, alone.
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256  # decode steps + score jobs + prefills sharing one forward
    # Prefills of at most this many tokens run whole (a turn's observation, an action prompt); longer
    # ones are chunked, and while other runs decode or score each chunk is sized so that the forward
    # costs at most ``max_decode_slowdown`` x a forward without it (sizes from measured costs; 0 = no
    # pacing: chunks of ``prefill_chunk_size``).
    prefill_chunk_size: int = 512
    max_decode_slowdown: float = 1.5
    # While heavy work waits (a selection, a context prefilled whole), light forwards (decode steps,
    # action prompts) go first, until they have cost this many times a heavy forward (measured): an
    # action with drafts often ends before the selection starts. 0 = one light forward, then the heavy.
    max_heavy_delay: float = 0.0
    # While decode steps or action prompts wait, each forward carries them and a slice of the waiting
    # selections (whole candidates within the Pacer's budget, the oldest selection at least one), instead
    # of one light forward and then the selection whole: a decode step never waits for a whole selection
    # (Sarathi-style). Off by default: selections take longer under concurrency. Exact engines ignore it.
    slice_selections: bool = False
    min_prefill_chunk: int = 1  # the least a paced long prefill advances per forward (no starvation)
    prefix_cache_bytes: int = 1 << 30
    prefix_cache_entries: int = 256
    max_context: int | None = None  # None: the model's max_position_embeddings
    threads: int | None = None  # torch intra-op threads; None: torch's default (all cores)
    bf16_matmul: Bf16Matmul = "auto"
    # Drafts verified in a decode step (speculate.py): outputs are unchanged, only forwards are saved.
    # At most ``speculative_tokens`` per generation per step, ``speculative_batch_tokens`` per forward
    # (many generations at once make a forward compute-bound: drafts would cost more than they save).
    speculative_tokens: int = 8
    speculative_batch_tokens: int = 96
    speculative_branches: int = 16  # a tree draft where the grammar admits 2..this many tokens next
    # Heavy forwards (selections, contexts prefilled whole) on a second thread while decode steps go on
    # (lane.py): "auto" = with one intra-op thread on a machine with a spare core. Off by default: it
    # trades selection latency for action latency (docs/engines/embedded.md says by how much)
    prefill_lane: str = "off"
    jump_forward: bool = True
    prompt_lookup: bool = True
    # Draft rows computed as one-token steps compute them (``exact``), so that drafts never change the
    # text in reduced precision, where a multi-row kernel can round a near-tie the other way: "auto" =
    # on for bf16 and fp16 when drafts are (docs/engines/embedded.md: exact drafts)
    exact_drafts: str = "auto"

    @property
    def exact(self) -> bool:
        if self.exact_drafts == "auto":
            drafts = self.speculative_tokens > 0 and (self.jump_forward or self.prompt_lookup)
            return drafts and self.dtype not in ("fp32", "float32")
        return self.exact_drafts == "on"

    def __post_init__(self) -> None:
        if self.dtype not in ("fp32", "float32", "bf16", "bfloat16", "fp16", "float16"):
            raise EngineError(f"unknown dtype {self.dtype!r}; use fp32, bf16 or fp16")
        if self.bf16_matmul not in ("auto", "native", "fp32"):
            raise EngineError(f"bf16_matmul must be auto, native or fp32, not {self.bf16_matmul!r}")
        for name in ("max_num_batched_tokens", "max_num_seqs", "prefill_chunk_size", "min_prefill_chunk",
                     "prefix_cache_bytes", "prefix_cache_entries"):
            if getattr(self, name) < 1:
                raise EngineError(f"engine config: {name} must be >= 1")
        if self.min_prefill_chunk > self.prefill_chunk_size:
            raise EngineError("engine config: min_prefill_chunk must be <= prefill_chunk_size")
        if self.prefill_chunk_size > self.max_num_batched_tokens:
            raise EngineError("engine config: prefill_chunk_size must be <= max_num_batched_tokens")
        if self.max_decode_slowdown != 0 and self.max_decode_slowdown <= 1:
            raise EngineError("engine config: max_decode_slowdown must be > 1 (or 0: no pacing)")
        if self.max_heavy_delay < 0:
            raise EngineError("engine config: max_heavy_delay must be >= 0")
        if self.max_context is not None and self.max_context < 2:
            raise EngineError("engine config: max_context must be >= 2")
        if min(self.speculative_tokens, self.speculative_batch_tokens, self.speculative_branches) < 0:
            raise EngineError("engine config: speculative_tokens, speculative_batch_tokens and "
                              "speculative_branches must be >= 0")
        if self.prefill_lane not in ("auto", "on", "off"):
            raise EngineError(f"engine config: prefill_lane must be auto, on or off, not "
                              f"{self.prefill_lane!r}")
        if self.exact_drafts not in ("auto", "on", "off"):
            raise EngineError(f"engine config: exact_drafts must be auto, on or off, not "
                              f"{self.exact_drafts!r}")
        if self.threads is not None and self.threads < 1:
            raise EngineError("engine config: threads must be >= 1")

    @classmethod
    def from_settings(cls, settings: Settings) -> EngineConfig:
        return cls(
            device=settings.device, dtype=settings.dtype,
            max_num_batched_tokens=settings.max_batched_tokens, max_num_seqs=settings.max_batched_seqs,
            prefill_chunk_size=settings.prefill_chunk_tokens,
            max_decode_slowdown=settings.max_decode_slowdown, max_heavy_delay=settings.max_heavy_delay,
            slice_selections=settings.slice_selections,
            prefix_cache_bytes=settings.prefix_cache_mb * 1024 * 1024, max_context=settings.max_context,
            threads=settings.torch_threads, bf16_matmul=settings.bf16_matmul,
            speculative_tokens=settings.speculative_tokens,
            speculative_branches=settings.speculative_branches, jump_forward=settings.jump_forward,
            prefill_lane=settings.prefill_lane,
            prompt_lookup=settings.prompt_lookup, exact_drafts=settings.exact_drafts,
        )

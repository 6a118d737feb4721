"""The work the scheduler trades with the engine: score and generate jobs, and running generations.

A job is submitted from the event loop and resolved on the worker thread through its
``concurrent.futures.Future``; every failure is set on the one job it belongs to.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from dataclasses import dataclass, field

import torch

from ssr_server.core.protocol import CandidateScore, Context, Generation, GenerationParams
from ssr_server.engine.torch.grammar import GrammarState
from ssr_server.engine.torch.kv import SeqKV
from ssr_server.engine.torch.runner import ChunkOut, Prepared
from ssr_server.engine.torch.sampling import Sampler
from ssr_server.engine.torch.speculate import TokenHistory


@dataclass(eq=False)
class Job:
    ctx: Context
    future: cf.Future[object] = field(default_factory=cf.Future)
    cancelled: bool = False
    submitted: float = field(default_factory=time.perf_counter)
    admitted: float = 0.0  # when the worker first took it (then its prefill, if any, begins)
    prep: Prepared | None = None  # set once resolved against the prefix cache
    paced: bool = False  # a long prefill: chunked, and paced against other runs' latency-critical work

    @property
    def need(self) -> int:
        """Tokens that must fit after the context (checked against the model's limit)."""
        return 0

    @property
    def reserve(self) -> int:
        """KV capacity to keep free after a freshly prefilled context."""
        return 0

    def dropped(self) -> bool:
        """Cancelled by its caller (then its future is cancelled too) or already failed/resolved."""
        if self.cancelled or self.future.cancelled():
            self.future.cancel()
            return True
        return self.future.done()


@dataclass(eq=False)
class ScoreJob(Job):
    candidates: list[list[int]] = field(default_factory=list)
    # A selection scored in slices (``slice_selections``): the outputs of its candidates scored so far
    # (views of their forward's own tensors, which no later forward writes)
    done: list[ChunkOut] = field(default_factory=list)

    @property
    def need(self) -> int:
        return max((len(c) for c in self.candidates), default=0)

    @property
    def reserve(self) -> int:
        # All candidates are written after the context in ONE forward: with room for them, a fresh
        # context's first scoring writes in place instead of copying the context's whole KV.
        return sum(len(c) for c in self.candidates)

    @property
    def todo(self) -> list[list[int]]:
        """The candidates not yet scored."""
        return self.candidates[len(self.done):]

    def keep(self, outs: list[ChunkOut]) -> None:
        """Keep a slice's candidate outputs until the last slice has run."""
        self.done += outs


@dataclass(eq=False)
class GenerateJob(Job):
    params: GenerationParams = field(default_factory=GenerationParams)
    grammar: GrammarState | None = None  # built off the worker thread (compiling costs ~0.5 s)
    draft: list[int] = field(default_factory=list)  # its first tokens, drafted into its prompt's forward

    @property
    def need(self) -> int:
        return self.params.max_new_tokens

    @property
    def reserve(self) -> int:
        return self.params.max_new_tokens + 1


@dataclass
class SeqStats:
    """Where a generation's time went after its prefill (``ssr-server bench actions`` reads them)."""

    forwards: int = 0  # decode forwards it took part in
    drafted: int = 0  # draft tokens fed (jump-forward and prompt lookup)
    trees: int = 0  # decode steps whose draft was a tree (one branch per token the grammar admits)
    accepted: int = 0  # of those, kept
    forward_s: float = 0.0  # wall time of those forwards (shared with the other jobs in them)
    grammar_s: float = 0.0  # masks, accepts and bitmask refills
    sample_s: float = 0.0
    draft_s: float = 0.0
    detok_s: float = 0.0  # detokenising: stop-string checks and the final text

    def timings(self) -> dict[str, float]:
        return {"forward_s": self.forward_s, "grammar_s": self.grammar_s, "sample_s": self.sample_s,
                "draft_s": self.draft_s, "detok_s": self.detok_s, "drafted": float(self.drafted),
                "trees": float(self.trees),
                "accepted": float(self.accepted)}


@dataclass(eq=False)
class Seq:
    """A running generation: its private KV, the key it will be cached under, the next logits."""

    job: GenerateJob
    kv: SeqKV
    key: list[int]
    next_pos: int
    sampler: Sampler
    prompt_tokens: int
    cached_tokens: int
    started: float
    logits: torch.Tensor  # (vocab,) float32: the distribution of the next token
    history: TokenHistory  # context and output, for prompt lookup
    generated: list[int] = field(default_factory=list)
    pending: int | None = None  # chosen by the last verification, taken at the next step
    stats: SeqStats = field(default_factory=SeqStats)
    # Exact drafts: the most tokens the next step drafts (halved after a step that kept none of its
    # draft, doubled after one that kept all): each exact row reads the whole KV again
    draft_limit: int = 64


def resolve(job: Job, value: list[CandidateScore] | Generation) -> None:
    if not job.future.done():
        job.future.set_result(value)


def fail(job: Job, exc: BaseException) -> None:
    if not job.future.done():
        job.future.set_exception(exc)

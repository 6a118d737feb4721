"""What one forward carries: pieces of work, each owned by one job, under the forward's budgets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ssr_server.engine.torch.config import EngineConfig
from ssr_server.engine.torch.jobs import Job, Seq
from ssr_server.engine.torch.runner import Chunk


@dataclass
class Work:
    kind: Literal["decode", "score", "prefill"]
    owner: Job
    chunks: list[Chunk]
    seq: Seq | None = None  # decode steps


@dataclass
class Batch:
    config: EngineConfig
    works: list[Work] = field(default_factory=list)
    tokens: int = 0
    multi_tokens: int = 0  # tokens of multi-token work (candidates, prefill chunks): not decode steps

    def add(self, work: Work) -> None:
        n = sum(len(c.ids) for c in work.chunks)
        self.works.append(work)
        self.tokens += n
        if work.kind != "decode":
            self.multi_tokens += n

    def room(self, tokens: int) -> bool:
        """Whether one more job of ``tokens`` tokens fits both budgets."""
        cfg = self.config
        return self.tokens + tokens <= cfg.max_num_batched_tokens and len(self.works) < cfg.max_num_seqs

    @property
    def chunks(self) -> list[Chunk]:
        return [c for w in self.works for c in w.chunks]

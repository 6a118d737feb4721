"""Contexts waiting for (the rest of) their prefill, in arrival order, and how much of each a forward takes.

Short prefills (at most ``prefill_chunk_size`` tokens: a turn's observation, an action prompt) run
whole: they are part of a turn's latency. Long ones run in chunks, oldest first; while other work
shares the forward, the ``Pacer`` sizes them; the oldest always advances (no starvation).

A context that shares more than ``prefill_chunk_size`` not-yet-cached tokens with a score job being
prefilled waits for it, then finds that prefix in the prefix cache, instead of computing it again:
concurrent agent runs all start with the same long system prompt (2,300 tokens in the default
format), and eight runs starting together would otherwise prefill it eight times.
"""

from __future__ import annotations

from ssr_server.engine.torch.batch import Batch, Work
from ssr_server.engine.torch.config import EngineConfig
from ssr_server.engine.torch.jobs import GenerateJob, Job, ScoreJob
from ssr_server.engine.torch.pacing import Pacer
from ssr_server.engine.torch.radix import RadixIndex
from ssr_server.engine.torch.runner import ModelRunner

LIGHT_TOKENS = 64  # an action prompt at most this long, without images, is as light as a decode step


class PrefillQueue:
    def __init__(self, runner: ModelRunner, config: EngineConfig, pacer: Pacer) -> None:
        self.runner = runner
        self.config = config
        self.pacer = pacer
        self.jobs: list[Job] = []  # arrival order
        self._index = RadixIndex()  # keys of the score jobs in ``jobs``
        self._followers: dict[int, list[Job]] = {}  # id(leader) -> jobs waiting for its prefix

    def __bool__(self) -> bool:
        return bool(self.jobs or self._followers)

    def every_job(self) -> list[Job]:
        return [*self.jobs, *(f for fs in self._followers.values() for f in fs)]

    def clear(self) -> None:
        self.jobs, self._followers = [], {}
        self._index.clear()

    def offer(self, job: Job) -> None:
        """Queue a prepared job, or make it wait for a leader that is prefilling its prefix."""
        p = job.prep
        assert p is not None  # internal invariant: offered jobs are prepared
        limit = self.config.prefill_chunk_size
        if p.todo > limit:
            found = self._index.longest(p.exp.key)
            if found is not None and found[1] - p.reused > limit:
                self._followers.setdefault(found[0], []).append(job)
                return
        job.paced = p.todo > limit
        self.jobs.append(job)
        if isinstance(job, ScoreJob):
            self._index.insert(p.exp.key, id(job))

    def leave(self, job: Job) -> list[Job]:
        """``job`` is prefilled, failed or dropped: it leaves; returns the jobs that waited for it
        (to be prepared again: the prefix is cached now, or they compute it themselves)."""
        if job in self.jobs:
            self.jobs.remove(job)
            if isinstance(job, ScoreJob) and job.prep is not None:
                self._index.remove(job.prep.exp.key, id(job))
        return self._followers.pop(id(job), [])

    def prune(self) -> list[Job]:
        """Drop cancelled or failed jobs; returns the jobs that waited for them."""
        released: list[Job] = []
        for job in [j for j in self.jobs if j.dropped()]:
            released += self.leave(job)
        for leader, followers in list(self._followers.items()):
            self._followers[leader] = [f for f in followers if not f.dropped()]
        return released

    @staticmethod
    def light(job: Job) -> bool:
        """A generation's short prompt without images (an action's opening): as light as a decode step."""
        p = job.prep
        return isinstance(job, GenerateJob) and p is not None and not job.paced and p.todo <= LIGHT_TOKENS \
            and all(s1 <= p.reused for _, s1 in p.exp.image_spans)

    def light_waiting(self) -> bool:
        """Whether an action prompt waits: a light forward is worth running for it alone."""
        return any(self.light(j) for j in self.jobs)

    @classmethod
    def whole_heavy(cls, job: Job) -> bool:
        """A prefill that runs whole and is not light (a context with its picture; long ones are paced)."""
        return not job.paced and not cls.light(job)

    def heavy(self) -> bool:
        """Whether a heavy prefill (``whole_heavy``) waits."""
        return any(self.whole_heavy(j) for j in self.jobs)

    def plan(self, batch: Batch, skip_heavy: bool = False, heavy_only: bool = False) -> None:
        """Add this forward's prefill work to ``batch``: ``skip_heavy``, all but the ``heavy`` ones;
        ``heavy_only``, those alone (no paced chunk either)."""
        cfg = self.config
        oldest = self.jobs[0] if self.jobs else None
        for job in self.jobs:  # short prefills: whole
            assert job.prep is not None
            heavy = self.whole_heavy(job)
            if (skip_heavy and heavy) or (heavy_only and not heavy):
                continue
            if not job.paced and (batch.room(job.prep.todo) or job is oldest):
                batch.add(Work("prefill", job, [self.runner.prefill_chunk(job.prep)]))
        if heavy_only:
            return
        budget = cfg.max_num_batched_tokens - batch.tokens
        paced = bool(batch.works)  # latency-critical work shares this forward
        if paced:
            budget = min(budget, self.pacer.chunk(batch.multi_tokens))
        for job in self.jobs:  # long prefills: chunks, oldest first
            assert job.prep is not None
            if not job.paced:
                continue
            n = min(job.prep.todo, budget)
            if job is oldest:  # the oldest always advances
                n = max(n, min(job.prep.todo, cfg.min_prefill_chunk))
            if n < 1 or len(batch.works) >= cfg.max_num_seqs:
                break
            chunk = self.runner.prefill_chunk(job.prep, n)
            batch.add(Work("prefill", job, [chunk]))
            budget -= len(chunk.ids)
            if paced:
                self.pacer.used(len(chunk.ids))

"""One worker thread owns the model; each ``step`` packs the work of concurrent runs into ONE forward.

A step takes, under the budgets of ``EngineConfig`` (tokens and sequences per forward):

1. one decode step of every running generation (round robin once there are more than fit): its next
   token followed by a draft of the tokens likely to come next (``speculate.py``), verified when the
   forward has run; a generation's first draft rides in its prompt's last prefill chunk;
2. the candidates of score jobs, oldest first (SSR's selection step is the latency-critical one: it
   goes ahead of every prefill, and the oldest always runs), on their cached context, or - when only a
   short rest of it is new (a turn's observation) - after that rest in the same forward, so that a
   selection costs one forward, not a prefill forward and then a scoring one;
3. short prefills whole (an action prompt, a context with nothing cached: part of a turn's latency);
4. chunks of long prefills, oldest first: while 1-3 share the forward, a chunk is sized by the
   ``Pacer`` so the forward costs at most ``max_decode_slowdown`` x one without it; alone, as much
   as the token budget allows. The oldest prefill always advances (no starvation).

While generations decode or an action prompt waits, and heavy work waits too (a selection, a context
prefilled whole), a step carries only the decode steps (1), short action prompts and paced chunks; the
next one carries the heavy work too: a decode step waits for one heavy forward in two, not for every
one. ``max_heavy_delay`` lets more light forwards go first (until they have cost that many times a
heavy forward): shorter actions, longer selections, and fewer runs a second, since a decode step that
rides in a heavy forward costs a fraction of one of its own (docs/engines/embedded.md).
``slice_selections`` instead lets each light forward carry a slice of the waiting selections (whole
candidates, the oldest selection at least one), so that a decode step waits for one candidate's rows.

A failure belongs to one job: a prepare error (bad image, ``ContextTooLong``) fails that job before any
work; a failed batched forward is re-run job by job, and only the jobs whose own forward fails are
failed; so are errors in one job's bookkeeping. Model work never runs on the event loop.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
import time
from collections import deque

from ssr_server.core.errors import EngineError, SSRError
from ssr_server.core.protocol import Generation
from ssr_server.engine.torch.batch import Batch, Work
from ssr_server.engine.torch.config import EngineConfig
from ssr_server.engine.torch.decode import Decoder
from ssr_server.engine.torch.drafter import Drafter
from ssr_server.engine.torch.jobs import GenerateJob, Job, ScoreJob, Seq, fail, resolve
from ssr_server.engine.torch.lane import Lane, wanted
from ssr_server.engine.torch.pacing import Pacer
from ssr_server.engine.torch.prefill_queue import PrefillQueue
from ssr_server.engine.torch.prefix_cache import CacheEntry
from ssr_server.engine.torch.runner import Chunk, ChunkOut, ModelRunner
from ssr_server.engine.torch.sampling import Sampler
from ssr_server.engine.torch.speculate import DraftConfig

log = logging.getLogger(__name__)


def _as_ssr(exc: BaseException) -> SSRError:
    return exc if isinstance(exc, SSRError) else EngineError(f"engine failure: {type(exc).__name__}: {exc}")


class Scheduler:
    def __init__(self, runner: ModelRunner, eos_ids: frozenset[int], config: EngineConfig,
                 start: bool = True) -> None:
        self.runner = runner
        self.config = config
        self.decoder = Decoder(runner.lm.tokenizer, eos_ids)
        self.pacer = Pacer(config.max_decode_slowdown, config.min_prefill_chunk, config.prefill_chunk_size)
        self.drafter = Drafter(DraftConfig.of(config), config.speculative_batch_tokens, self.decoder,
                               runner.vocab_size)
        self._inbox: list[Job] = []
        self._prefills = PrefillQueue(runner, config, self.pacer)
        self._ready: deque[ScoreJob] = deque()  # contexts cached, candidates not yet scored
        self._running: deque[Seq] = deque()
        self._light = False  # the forward planned last carries no heavy work while some waits
        self._light_spent = 0.0  # seconds of such light forwards since heavy work last ran
        self._sliced = False  # the forward planned last carries a slice of a selection (not heavy work)
        self._heavy_s = 0.0  # a heavy forward's cost (moving average)
        self._cv = threading.Condition()
        # An exact engine scores a selection whole: a slice's candidates attend through other shapes than
        # the whole selection's, which would make the last bits of its scores depend on timing
        self._slicing = config.slice_selections and not runner.exact
        self._lane = Lane(self._cv) if wanted(config.prefill_lane, config.threads) else None
        self._stop = False
        self.batches = 0  # forwards run
        self.max_batch = 0  # most jobs in one forward
        self._thread: threading.Thread | None = None
        if start:  # tests may drive ``step`` themselves instead
            self._thread = threading.Thread(target=self._loop, name="ssr-torch-worker", daemon=True)
            self._thread.start()

    @property
    def alive(self) -> bool:
        return not self._stop and (self._thread is None or self._thread.is_alive())

    def submit(self, job: Job) -> cf.Future[object]:
        with self._cv:
            if self._stop:
                raise EngineError("engine is closed")
            self._inbox.append(job)
            self._cv.notify()
        return job.future

    def close(self, timeout: float = 10.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout)
        else:
            self._fail_all(EngineError("engine is closed"))

    def idle(self) -> bool:
        return not (self._inbox or self._prefills or self._ready or self._running
                    or (self._lane is not None and self._lane.busy))

    def run_until_idle(self) -> None:
        """Drive the scheduler on this thread (only when constructed with ``start=False``)."""
        while self.step():
            pass

    # ---- worker ------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                while self.idle() and not self._stop:
                    self._cv.wait()
                if self._stop:
                    break
            try:
                self.step()
            except Exception as exc:  # a scheduler bug, not a job's fault: fail what is in flight
                log.exception("engine step failed")
                self._fail_all(_as_ssr(exc))
        self._fail_all(EngineError("engine is closed"))

    def _fail_all(self, err: SSRError) -> None:
        with self._cv:
            inbox, self._inbox = self._inbox, []
        lane: list[Job] = []
        if self._lane is not None:
            lane = self._lane.jobs()
            if self._stop:
                self._lane.close()  # its forward finishes first: the model is not used after close
            elif self._lane.done:
                self._lane.take_quietly()
        for job in [*inbox, *lane, *self._prefills.every_job(), *self._ready,
                    *(s.job for s in self._running)]:
            fail(job, err)
        self._prefills.clear()
        self._ready, self._running = deque(), deque()

    def step(self) -> bool:
        """Admit new jobs, then plan, run and apply one forward. False once there is nothing left."""
        with self._cv:
            new, self._inbox = self._inbox, []
        for job in new:
            self._admit(job)
        if self._lane is not None and self._lane.done:
            self._apply(*self._lane.take())
        t0 = time.perf_counter()
        batch = self._plan()
        if not batch.works:
            if self._lane is not None and self._lane.busy:  # nothing but the lane's batch: wait for it
                with self._cv:                              # (or for a new job)
                    if not self._inbox and not self._lane.done:
                        self._cv.wait(timeout=0.05)
            return not self.idle()
        outs = self._forward(batch)
        self._apply(batch, outs)
        spent = time.perf_counter() - t0
        self.pacer.observe(spent, batch.multi_tokens)
        if self._light:
            self._light_spent += spent
        elif not self._sliced and any(
                w.kind == "score" or (w.kind == "prefill" and PrefillQueue.whole_heavy(w.owner))
                for w in batch.works):
            self._heavy_s = spent if self._heavy_s == 0.0 else 0.8 * self._heavy_s + 0.2 * spent
        self.batches += 1
        self.max_batch = max(self.max_batch, len(batch.works))
        return True

    # ---- admission -------------------------------------------------------------------------------
    def _admit(self, job: Job) -> None:
        if job.dropped():
            return
        job.admitted = job.admitted or time.perf_counter()
        try:
            job.prep = p = self.runner.prepare(job.ctx, reuse_candidates=isinstance(job, GenerateJob),
                                               reserve=job.reserve, need=job.need)
        except Exception as exc:  # a bad image, a context too long, ...: this job only, before any work
            fail(job, _as_ssr(exc))
            return
        if p.todo == 0:
            self._prefilled(job)
        elif isinstance(job, ScoreJob) and p.kv is not None and p.todo <= self.config.prefill_chunk_size:
            self._ready.append(job)  # a short rest (a turn's observation): prefilled as it is scored
        else:
            self._prefills.offer(job)

    def _prefilled(self, job: Job) -> None:
        p = job.prep
        assert p is not None  # internal invariant: admitted jobs are prepared
        if isinstance(job, ScoreJob):
            self.runner.finish_prefill(p)
            self._ready.append(job)
            return
        assert isinstance(job, GenerateJob) and p.last_logits is not None
        # A wholly cached prompt is forked so that the shared entry stays intact.
        kv = p.entry.kv.fork(extra=job.reserve + 16) if p.entry is not None else p.kv
        assert kv is not None
        sampler = Sampler(job.params, self.runner.device)
        history = self.drafter.history(p.exp.key)  # copied into its own buffer
        self._running.append(Seq(job, kv, list(p.exp.key), p.next_pos, sampler, len(p.exp.ids),
                                 p.cached_tokens, time.perf_counter(), p.last_logits, history))

    # ---- planning ------------------------------------------------------------------------------
    def _plan(self) -> Batch:
        batch = Batch(self.config)
        self._plan_decode(batch)
        self._sliced = False
        lane = self._lane
        if lane is not None and (lane.busy or self._ready or self._prefills.heavy()):
            # heavy work goes to the lane (always: this thread stays free for the decode steps and
            # action prompts that may come while it runs)
            if not lane.busy:
                heavy = Batch(self.config)
                self._plan_scoring(heavy)
                self._plan_prefill(heavy, heavy_only=True)
                if heavy.works:
                    lane.submit(heavy, self._forward)
            self._plan_prefill(batch, skip_heavy=True)
            return batch
        light = bool(batch.works) or self._prefills.light_waiting()
        if light and self._ready and self._slicing \
                and not (self._prefills.heavy() and not self._light_first()):
            # Decode steps or action prompts go now, and selections ride with them a slice at a time
            # (a heavy prefill still waits as below). Its time counts as delay only while a heavy
            # prefill waits: one that comes later still gets its first light forward (``_light_first``)
            self._light, self._sliced = self._prefills.heavy(), True
            if not self._light:
                self._light_spent = 0.0
            self._plan_scoring(batch, sliced=True)
            self._plan_prefill(batch, skip_heavy=True)
            return batch
        if (self._ready or self._prefills.heavy()) and light and self._light_first():
            # Heavy work (a selection with its observation's prefill: ~45 ms here, 15x a decode step)
            # is waiting: this forward carries the decode steps and action prompts alone, and so do the
            # next ones until they have cost ``max_heavy_delay`` x a heavy forward; then the heavy work
            # runs, beside the decode steps. Shortest work first: an action (a few light forwards with
            # drafts) often ends before the selection starts, instead of waiting for one in two.
            self._light = True
            self._plan_prefill(batch, skip_heavy=True)
            return batch
        self._light = False
        self._light_spent = 0.0
        self._plan_scoring(batch)
        self._plan_prefill(batch)
        return batch

    def _light_first(self) -> bool:
        """Whether heavy work may wait one more light forward: always the first; then while the light
        forwards it waited for cost less than ``max_heavy_delay`` x a heavy forward (measured)."""
        return self._light_spent == 0.0 or self._light_spent < self.config.max_heavy_delay * self._heavy_s

    def _plan_decode(self, batch: Batch) -> None:
        """Choose each running generation's next token; feed those that go on (round robin), each
        followed by its draft (verified when the forward has run: ``_after_decode``)."""
        dims = 3 if self.runner.lm.is_vl else 1
        draft_room = self.drafter.budget()
        for _ in range(len(self._running)):
            if not batch.room(1):
                break
            seq = self._running.popleft()
            if seq.job.dropped():
                continue
            try:
                tok = self.decoder.next_token(seq)
                result = self.decoder.finished(seq)
                if result is not None:
                    self._cache_finished(seq)
                    resolve(seq.job, result)
                    continue
            except Exception as exc:
                fail(seq.job, _as_ssr(exc))
                continue
            rows = min(draft_room, self.config.max_num_batched_tokens - batch.tokens - 1)
            chains = self.drafter.for_step(seq, tok, seq.job.params.max_new_tokens - len(seq.generated), rows)
            draft_room -= sum(len(c) for c in chains)
            batch.add(Work("decode", seq.job, [self.drafter.step_chunk(seq, tok, chains, dims)], seq))
            self._running.append(seq)  # served: to the back

    def _plan_scoring(self, batch: Batch, sliced: bool = False) -> None:
        """Candidates, oldest first (the oldest always runs): on their cached context, or after the
        rest of it in the same forward (a short rest: one forward per selection instead of two).
        ``sliced``: whole candidates within the Pacer's budget, the oldest job at least one."""
        budget = self.pacer.chunk(batch.multi_tokens) if sliced else 0
        scored = False
        while self._ready:
            job = self._ready[0]
            p = job.prep
            assert p is not None  # internal invariant: ready jobs are prepared
            rest = p.todo if p.entry is None else 0
            cands = job.todo
            if sliced and not job.dropped():
                used, take = rest, 0
                while take < len(cands) and (used + len(cands[take]) <= budget or not (scored or take)):
                    used += len(cands[take])
                    take += 1
                if take == 0 or (scored and not batch.room(used)):
                    break
                cands, budget = cands[:take], budget - used
            elif not job.dropped() and scored and not batch.room(sum(map(len, cands)) + rest):
                break
            if job.dropped() or len(cands) == len(job.todo):
                self._ready.popleft()
            if job.dropped():
                continue
            try:
                if p.entry is None:
                    chunks = self.runner.fused_score_chunks(p, cands)
                else:
                    chunks = self.runner.score_chunks([(p.entry, cands)])
            except Exception as exc:  # this job's own fault (e.g. its image): it alone fails
                fail(job, _as_ssr(exc))
                continue
            batch.add(Work("score", job, chunks))
            scored = True
            if len(cands) < len(job.todo):
                break  # a slice: the budget is spent

    def _plan_prefill(self, batch: Batch, skip_heavy: bool = False, heavy_only: bool = False) -> None:
        for job in self._prefills.prune():  # their leader was dropped: they prefill themselves
            self._admit(job)
        first = len(batch.works)
        self._prefills.plan(batch, skip_heavy, heavy_only)
        for w in batch.works[first:]:  # a generation's first draft rides in its prompt's last chunk
            if isinstance(w.owner, GenerateJob):
                room = min(self.drafter.budget(), self.config.max_num_batched_tokens - batch.tokens)
                n = len(w.chunks[0].ids)
                w.chunks[0] = self.drafter.into_prompt(w.owner, w.chunks[0], room)
                batch.tokens += len(w.chunks[0].ids) - n
                batch.multi_tokens += len(w.chunks[0].ids) - n

    # ---- running -------------------------------------------------------------------------------
    def _forward(self, batch: Batch) -> list[list[ChunkOut] | None]:
        """Per work, its chunks' outputs (None: it failed, and its job was failed)."""
        t0 = time.perf_counter()
        try:
            flat = self.runner.forward([c for w in batch.works for c in w.chunks])
            spent = time.perf_counter() - t0
            for w in batch.works:
                if w.seq is not None:
                    w.seq.stats.forwards += 1
                    w.seq.stats.forward_s += spent
        except Exception as exc:
            if len(batch.works) == 1:
                fail(batch.works[0].owner, _as_ssr(exc))
                return [None]
            log.warning("a forward of %d jobs failed (%s); running them one by one", len(batch.works), exc)
            return [self._forward_alone(w) for w in batch.works]
        outs: list[list[ChunkOut] | None] = []
        i = 0
        for w in batch.works:
            outs.append(flat[i : i + len(w.chunks)])
            i += len(w.chunks)
        return outs

    def _forward_alone(self, work: Work) -> list[ChunkOut] | None:
        try:
            return self.runner.forward(work.chunks)
        except Exception as exc:
            fail(work.owner, _as_ssr(exc))
            return None

    def _apply(self, batch: Batch, outs: list[list[ChunkOut] | None]) -> None:
        scored = [(w, o) for w, o in zip(batch.works, outs, strict=True) if w.kind == "score" and o]
        if scored:
            self._score_results(scored)
        for w, o in zip(batch.works, outs, strict=True):
            if not o or w.kind == "score" or w.owner.dropped():
                continue
            try:
                if w.seq is not None:
                    self._after_decode(w.seq, w.chunks[0], o[0])
                else:
                    self._after_prefill(w.owner, w.chunks[0], o[0])
            except Exception as exc:
                fail(w.owner, _as_ssr(exc))

    def _score_results(self, scored: list[tuple[Work, list[ChunkOut]]]) -> None:
        jobs: list[tuple[ScoreJob, CacheEntry, int]] = []
        cand_outs: list[list[ChunkOut]] = []
        for w, outs in scored:
            job = w.owner
            assert isinstance(job, ScoreJob) and job.prep is not None
            if job.prep.entry is None:  # fused: the context's rest ran first in this forward
                try:
                    self.runner.commit(job.prep, w.chunks[0], outs[0])
                    self.runner.finish_prefill(job.prep)
                except Exception as exc:
                    fail(job, _as_ssr(exc))
                    continue
                outs = outs[1:]
            if len(job.done) + len(outs) < len(job.candidates):  # a slice: the rest in later forwards
                job.keep(outs)
                continue
            outs = [*job.done, *outs]
            assert job.prep.entry is not None
            jobs.append((job, job.prep.entry, job.prep.cached_tokens))
            cand_outs.append(outs)
        if not jobs:
            return
        try:  # one log-softmax over every candidate of every job
            results = self.runner.score_results([(e, j.candidates) for j, e, _ in jobs],
                                                [x for outs in cand_outs for x in outs],
                                                [c for _, _, c in jobs])
        except Exception:  # then each job on its own: a failure stays with its job
            for (job, entry, cached), outs in zip(jobs, cand_outs, strict=True):
                try:
                    resolve(job, self.runner.score_results([(entry, job.candidates)], outs, [cached])[0])
                except Exception as exc:
                    fail(job, _as_ssr(exc))
            return
        for (job, _, _), res in zip(jobs, results, strict=True):
            resolve(job, res)

    def _after_prefill(self, job: Job, chunk: Chunk, out: ChunkOut) -> None:
        assert job.prep is not None
        full, draft = out, list[int]()
        if isinstance(job, GenerateJob):
            chunk, out, draft = self.drafter.split_prompt(job, chunk, out)
        self.runner.commit(job.prep, chunk, out)
        if job.prep.todo == 0:
            followers = self._prefills.leave(job)
            self._prefilled(job)
            if draft:
                seq = self._running[-1]
                self._finish_if(seq, self.drafter.keep(seq, [], draft, full, offset=len(chunk.ids)))
            for f in followers:  # the prefix they waited for is in the prefix cache now
                self._admit(f)

    def _after_decode(self, seq: Seq, chunk: Chunk, out: ChunkOut) -> None:
        """Keep the fed token and the part of its draft the sequence would have chosen itself."""
        self._finish_if(seq, self.drafter.keep_step(seq, chunk, out))

    def _finish_if(self, seq: Seq, result: Generation | None) -> None:
        if result is not None:  # then its job is done, and the next plan drops it from the running
            self._cache_finished(seq)
            resolve(seq.job, result)

    def _cache_finished(self, seq: Seq) -> None:
        self.drafter.learn(seq)
        # The KV holds everything but the last sampled token (never fed): cache it for the next turn,
        # without the spare room reserved for max_new_tokens.
        kv = seq.kv.fork(extra=64) if seq.kv.capacity > seq.kv.length + 256 else seq.kv
        self.runner.cache.insert(CacheEntry(tuple(seq.key), kv, seq.logits, seq.next_pos))

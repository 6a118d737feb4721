"""One worker thread owns the model and batches the work of concurrent runs.

Each iteration takes every job that arrived, then:
1. resolves contexts against the prefix cache and prefills what is missing, all in one forward;
2. scores the candidates of every scoring job in one forward;
3. advances every active generation by one token, all in one forward.
Scoring jobs are taken between decode steps, so a long generation never holds up another run's
(short, latency-critical) selection step. Model work never runs on the event loop.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
import time
from dataclasses import dataclass, field

import torch

from ssr_server.engine.base import CandidateScore, Context, Generation, GenerationParams
from ssr_server.engine.stop import find_stop
from ssr_server.engine.torch.kv import SeqKV
from ssr_server.engine.torch.prefix_cache import CacheEntry
from ssr_server.engine.torch.runner import Chunk, ChunkOut, ModelRunner, Prepared
from ssr_server.engine.torch.sampling import Sampler
from ssr_server.errors import EngineError, SSRError

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Job:
    ctx: Context
    future: cf.Future[object] = field(default_factory=cf.Future)
    cancelled: bool = False
    submitted: float = field(default_factory=time.perf_counter)


@dataclass(eq=False)
class ScoreJob(Job):
    candidates: list[list[int]] = field(default_factory=list)


@dataclass(eq=False)
class GenerateJob(Job):
    params: GenerationParams = field(default_factory=GenerationParams)


@dataclass(eq=False)
class _Seq:
    job: GenerateJob
    kv: SeqKV
    key: list[int]
    next_pos: int
    sampler: Sampler
    prompt_tokens: int
    cached_tokens: int
    started: float
    generated: list[int] = field(default_factory=list)
    logits: torch.Tensor | None = None


class Scheduler:
    def __init__(self, runner: ModelRunner, eos_ids: frozenset[int]) -> None:
        self.runner = runner
        self.eos_ids = eos_ids
        self._pending: list[Job] = []
        self._active: list[_Seq] = []
        self._cv = threading.Condition()
        self._stop = False
        self.batches = 0
        self.max_batch = 0
        self._pieces: dict[int, str] = {}  # token id -> its text alone (stop-string pre-check)
        self._thread = threading.Thread(target=self._loop, name="ssr-torch-worker", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stop

    def submit(self, job: Job) -> cf.Future[object]:
        with self._cv:
            if self._stop:
                raise EngineError("engine is closed")
            self._pending.append(job)
            self._cv.notify()
        return job.future

    def close(self, timeout: float = 10.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout)

    # ---- worker ------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._active and not self._stop:
                    self._cv.wait()
                if self._stop:
                    break
                new, self._pending = self._pending, []
            try:
                self._iteration(new)
            except Exception as exc:  # never let the worker die: fail what was in flight
                log.exception("engine iteration failed")
                err = exc if isinstance(exc, SSRError) else EngineError(f"engine failure: {exc}")
                for job in [*new, *(s.job for s in self._active)]:
                    _fail(job, err)
                self._active = []
        for job in [*self._pending, *(s.job for s in self._active)]:
            _fail(job, EngineError("engine is closed"))

    def _iteration(self, new: list[Job]) -> None:
        live = [j for j in new if not _cancel_if_needed(j)]
        scores = [j for j in live if isinstance(j, ScoreJob)]
        gens = [j for j in live if isinstance(j, GenerateJob)]
        preps: dict[Job, Prepared] = {}
        for j in live:
            try:
                preps[j] = self.runner.prepare(j.ctx, reuse_candidates=isinstance(j, GenerateJob))
            except SSRError as exc:
                _fail(j, exc)
        todo = [j for j in live if j in preps and preps[j].entry is None and preps[j].todo > 0]
        if todo:
            outs = self.runner.forward([self.runner.prefill_chunk(preps[j]) for j in todo])
            for j, out in zip(todo, outs, strict=True):
                self.runner.commit(preps[j], out)
            self._note_batch(len(todo))
        ready: list[tuple[ScoreJob, CacheEntry]] = []
        for j in scores:
            if j in preps:
                p = preps[j]
                if p.entry is None:
                    assert p.kv is not None and p.last_logits is not None
                    p.entry = CacheEntry(p.exp.key, p.kv, p.last_logits, p.next_pos)
                    self.runner.cache.insert(p.entry)
                ready.append((j, p.entry))
        for j in gens:
            if j in preps:
                self._start(j, preps[j])
        # Candidate scoring and one decode step of every active generation share ONE forward.
        score_jobs = [(e, j.candidates) for j, e in ready]
        score_chunks = self.runner.score_chunks(score_jobs)
        feeding, decode_chunks = self._decode_chunks()
        if not score_chunks and not decode_chunks:
            return
        outs = self.runner.forward(score_chunks + decode_chunks)
        self._note_batch(len(ready) + len(feeding))
        if ready:
            results = self.runner.score_results(score_jobs, outs[: len(score_chunks)],
                                                cached=[preps[j].cached_tokens for j, _ in ready])
            for (j, _), res in zip(ready, results, strict=True):
                _resolve(j, res)
        self._decode_update(feeding, outs[len(score_chunks) :])

    def _start(self, job: GenerateJob, p: Prepared) -> None:
        if p.entry is not None:  # whole prompt cached: fork so the shared entry stays intact
            kv = p.entry.kv.fork(extra=job.params.max_new_tokens + 16)
        else:
            assert p.kv is not None
            kv = p.kv
        n = len(p.exp.ids)
        assert p.last_logits is not None
        seq = _Seq(job, kv, list(p.exp.key), p.next_pos, Sampler(job.params), n, p.cached_tokens,
                   time.perf_counter())
        seq.logits = p.last_logits
        self._active.append(seq)

    def _decode_chunks(self) -> tuple[list[_Seq], list[Chunk]]:
        """Sample each active generation's next token; one-token chunks for those that go on."""
        feeding: list[_Seq] = []
        for seq in self._active:
            if _cancel_if_needed(seq.job):
                continue
            assert seq.logits is not None
            tok = seq.sampler(seq.logits)
            seq.generated.append(tok)
            if not self._finish_if_done(seq):
                feeding.append(seq)
        self._active = feeding
        dims = 3 if self.runner.lm.is_vl else 1
        chunks = []
        for seq in feeding:
            pos = torch.full((dims, 1), seq.next_pos, dtype=torch.long)
            chunks.append(Chunk(seq.kv, [seq.generated[-1]], pos, [0], past_len=seq.kv.length))
        return feeding, chunks

    def _decode_update(self, feeding: list[_Seq], outs: list[ChunkOut]) -> None:
        for seq, out in zip(feeding, outs, strict=True):
            if out.inplace:
                seq.kv.length += 1
            else:
                seq.kv.append(out.keys, out.values)
            seq.key.append(seq.generated[-1])
            seq.next_pos += 1
            seq.logits = out.logits[0]

    def _finish_if_done(self, seq: _Seq) -> bool:
        params = seq.job.params
        tok = seq.generated[-1]
        tokenizer = self.runner.lm.tokenizer
        reason: str | None = None
        stop_text: str | None = None
        text = ""
        cut = 0
        if tok in self.eos_ids and not params.ignore_eos:
            reason = "eos"
            text = tokenizer.decode(seq.generated[:-1], skip_special_tokens=False)
            cut = len(text)
        elif params.stop and self._tail_has_stop(seq.generated, params.stop):
            # Only the tail is decoded each step; the whole text once, when a stop string showed up.
            text = tokenizer.decode(seq.generated, skip_special_tokens=False)
            hit = find_stop(text, params.stop)
            if hit is not None:
                reason, cut, stop_text = "stop", hit[0], hit[1]
        if reason is None and len(seq.generated) >= params.max_new_tokens:
            reason = "length"
            text = tokenizer.decode(seq.generated, skip_special_tokens=False)
            cut = len(text)
        if reason is None:
            return False
        # The KV holds everything but the last sampled token (never fed): cache it for the next turn,
        # without the spare room reserved for max_new_tokens.
        kv = seq.kv.fork(extra=64) if seq.kv.capacity > seq.kv.length + 256 else seq.kv
        entry = CacheEntry(tuple(seq.key), kv, seq.logits if seq.logits is not None
                           else torch.zeros(0), seq.next_pos)
        self.runner.cache.insert(entry)
        elapsed = time.perf_counter() - seq.started
        _resolve(seq.job, Generation(
            token_ids=tuple(seq.generated), text=text[:cut], finish_reason=reason,  # type: ignore[arg-type]
            prompt_tokens=seq.prompt_tokens, cached_tokens=seq.cached_tokens, elapsed_s=elapsed,
            stop_text=stop_text,
            timings={"queue_s": seq.started - seq.job.submitted, "generate_s": elapsed},
        ))
        return True

    def _piece(self, tok: int) -> str:
        piece = self._pieces.get(tok)
        if piece is None:
            piece = self._pieces[tok] = self.runner.lm.tokenizer.decode([tok], skip_special_tokens=False)
        return piece

    def _tail_has_stop(self, generated: list[int], stops: tuple[str, ...]) -> bool:
        # A stop string that ended with the newest token ends with a character of that token's text,
        # so most steps are settled by a dict lookup; a token holding part of a multi-byte character
        # decodes to U+FFFD on its own and always gets the full check, as do stops ending in white
        # space (some tokenizers drop a token's leading space when it is decoded alone).
        piece = self._piece(generated[-1])
        quick = all(s and not s[-1].isspace() for s in stops) and "\ufffd" not in piece
        if quick and not any(s[-1] in piece for s in stops):
            return False
        # Every token holds at least one byte, so a stop string that ended with the newest token lies
        # within its last len(stop in bytes) + 4 tokens.
        n = max(len(s.encode()) for s in stops) + 4
        tail = self.runner.lm.tokenizer.decode(generated[-n:], skip_special_tokens=False)
        return find_stop(tail, stops) is not None

    def _note_batch(self, size: int) -> None:
        self.batches += 1
        self.max_batch = max(self.max_batch, size)


def _cancel_if_needed(job: Job) -> bool:
    if job.cancelled or job.future.cancelled():
        job.future.cancel()
        return True
    return False


def _resolve(job: Job, value: list[CandidateScore] | Generation) -> None:
    if not job.future.done():
        job.future.set_result(value)


def _fail(job: Job, exc: BaseException) -> None:
    if not job.future.done():
        job.future.set_exception(exc)

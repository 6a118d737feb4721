"""The scheduler, driven step by step on the test thread (``start=False``): budgets per forward, chunked
prefill interleaved with decoding, scoring ahead of long prefills, no starvation, failures isolated
per job, contexts over the model's limit refused before any work, KV reserved for the candidates."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch

from ssr_server.core.errors import ContextTooLong, EngineError, InvalidRequest
from ssr_server.core.protocol import CandidateScore, Context, Generation, GenerationParams, ImageRef
from ssr_server.engine.torch.config import EngineConfig
from ssr_server.engine.torch.engine import TorchEngine
from ssr_server.engine.torch.jobs import GenerateJob, Job, ScoreJob
from ssr_server.engine.torch.loader import LoadedModel
from ssr_server.engine.torch.multimodal import ImageCache, expand
from ssr_server.engine.torch.runner import Chunk

TOL = 1e-4


class Tap:
    """Every forward's chunks, recorded on the runner; a forward holding ``poison`` (a chunk's ids)
    raises, as a forward that one job's input breaks would."""

    def __init__(self, engine: TorchEngine, poison: list[int] | None = None) -> None:
        self.forwards: list[list[Chunk]] = []
        inner = engine.runner.forward

        def forward(chunks: list[Chunk]) -> Any:
            self.forwards.append(list(chunks))
            if poison is not None and any(c.ids == poison for c in chunks):
                raise RuntimeError("poisoned chunk in this forward")
            return inner(chunks)

        engine.runner.forward = forward  # type: ignore[method-assign]

    def tokens(self, i: int) -> int:
        return sum(len(c.ids) for c in self.forwards[i])


def submit(engine: TorchEngine, *jobs: Job) -> None:
    for j in jobs:
        engine.scheduler.submit(j)


def long_context(tok: Any, n: int, salt: str = "") -> Context:
    text = f"{salt} " + " ".join(f"item {i} is a tower of iron." for i in range(n))
    return Context(tuple(tok.encode(text, add_special_tokens=False)[:n]))


def generation(job: Job) -> Generation:
    out = job.future.result()
    assert isinstance(out, Generation)
    return out


def max_diff(a: list[CandidateScore], b: list[CandidateScore]) -> float:
    return max(abs(x - y) for s, t in zip(a, b, strict=True)
               for x, y in zip(s.token_logprobs, t.token_logprobs, strict=True))


# ---------------------------------------------------------------- budgets and chunked prefill


def test_token_and_sequence_budgets(make_engine: Callable[..., TorchEngine], tok: Any,
                                    contexts: dict[str, Context], candidates: list[list[int]]) -> None:
    engine = make_engine(max_num_batched_tokens=64, max_num_seqs=3, prefill_chunk_size=32,
                         max_decode_slowdown=0, min_prefill_chunk=4)
    tap = Tap(engine)
    gens = [GenerateJob(contexts["text"], params=GenerationParams(max_new_tokens=6)) for _ in range(4)]
    scores = [ScoreJob(long_context(tok, 200, str(i)), candidates=candidates[:2]) for i in range(2)]
    submit(engine, *gens, *scores)
    engine.scheduler.run_until_idle()
    for j in [*gens, *scores]:
        assert j.future.result() is not None
    for i, chunks in enumerate(tap.forwards):
        # the oldest prefill may add its minimum chunk (4) past the token budget: no starvation
        assert tap.tokens(i) <= 64 + 4, f"forward {i}: {tap.tokens(i)} tokens"
        jobs = {id(c.past) if c.past is not None else id(c) for c in chunks}  # one past per job here
        assert len(jobs) <= 3, f"forward {i}: {len(jobs)} jobs"
    assert len(tap.forwards) > 10


def test_long_prefill_is_chunked_between_decode_steps(make_engine: Callable[..., TorchEngine], tok: Any,
                                                      runner: Any, contexts: dict[str, Context],
                                                      candidates: list[list[int]]) -> None:
    engine = make_engine(prefill_chunk_size=32, max_decode_slowdown=0, min_prefill_chunk=4)
    tap = Tap(engine)
    gen = GenerateJob(contexts["image"], params=GenerationParams(max_new_tokens=40, ignore_eos=True))
    submit(engine, gen)
    for _ in range(3):
        engine.scheduler.step()  # the generation is decoding
    ctx = long_context(tok, 300)
    score = ScoreJob(ctx, candidates=candidates)
    submit(engine, score)
    first = len(tap.forwards)
    engine.scheduler.run_until_idle()
    during = [f for f in tap.forwards[first:]  # forwards holding a prefill chunk that is not the last
              if any(len(c.ids) > 1 and not c.logits_rows and not c.self_logprobs for c in f)]
    assert len(during) >= 300 // 32 - 1  # the prefill went in many chunks ...
    for f in during:  # ... each at most the chunk size, each beside one decode step of the other run
        assert sum(1 for c in f if len(c.logits_rows) == len(c.ids) and not c.self_logprobs) == 1  # decode
        assert max(len(c.ids) for c in f if len(c.ids) > 1) <= 32
    got = score.future.result()
    assert isinstance(got, list) and max_diff(got, runner.naive_score(ctx, candidates)) <= TOL
    alone = make_engine()
    solo = GenerateJob(contexts["image"], params=GenerationParams(max_new_tokens=40, ignore_eos=True))
    submit(alone, solo)
    alone.scheduler.run_until_idle()
    assert generation(gen).token_ids == generation(solo).token_ids


def test_paced_chunks_follow_measured_costs(make_engine: Callable[..., TorchEngine], tok: Any,
                                            contexts: dict[str, Context],
                                            candidates: list[list[int]]) -> None:
    """With pacing on, chunks start at the minimum and stay within the configured maximum."""
    engine = make_engine(prefill_chunk_size=64, max_decode_slowdown=1.5, min_prefill_chunk=4)
    tap = Tap(engine)
    submit(engine, GenerateJob(contexts["text"], params=GenerationParams(max_new_tokens=80, ignore_eos=True)))
    engine.scheduler.step()
    engine.scheduler.step()
    submit(engine, ScoreJob(long_context(tok, 300), candidates=candidates[:1]))
    engine.scheduler.run_until_idle()
    sizes = [len(c.ids) for f in tap.forwards if len(f) == 2  # a decode step + a prefill chunk
             for c in f if len(c.ids) > 1 and not c.self_logprobs and len(c.logits_rows) < len(c.ids)]
    assert sizes and sizes[0] == 4 and max(sizes) <= 64
    assert all(b <= 2 * a for a, b in itertools.pairwise(sizes))  # grows at most 2x


# ---------------------------------------------------------------- order and fairness


def test_scoring_goes_ahead_of_a_long_prefill(make_engine: Callable[..., TorchEngine], tok: Any,
                                              contexts: dict[str, Context],
                                              candidates: list[list[int]]) -> None:
    engine = make_engine(max_num_batched_tokens=64, prefill_chunk_size=16, max_decode_slowdown=0,
                         min_prefill_chunk=4)
    warm = ScoreJob(contexts["text"], candidates=candidates)
    submit(engine, warm)
    engine.scheduler.run_until_idle()
    long_job = ScoreJob(long_context(tok, 400), candidates=candidates)
    submit(engine, long_job)
    engine.scheduler.step()
    quick = ScoreJob(contexts["text"], candidates=candidates[:2])  # cached context: scoring only
    submit(engine, quick)
    engine.scheduler.step()
    assert quick.future.done() and not long_job.future.done()
    engine.scheduler.run_until_idle()
    assert long_job.future.result()


def test_no_starvation_of_a_long_prefill(make_engine: Callable[..., TorchEngine], tok: Any,
                                         contexts: dict[str, Context], candidates: list[list[int]]) -> None:
    """A stream of score jobs that fills every forward's token budget still lets the oldest prefill
    advance by at least the minimum chunk per forward."""
    engine = make_engine(max_num_batched_tokens=64, prefill_chunk_size=32, max_decode_slowdown=0,
                         min_prefill_chunk=8)
    submit(engine, ScoreJob(contexts["text"], candidates=candidates))
    engine.scheduler.run_until_idle()
    long_job = ScoreJob(long_context(tok, 160), candidates=candidates[:1])
    submit(engine, long_job)
    steps = 0
    while not long_job.future.done():
        submit(engine, ScoreJob(contexts["text"], candidates=candidates * 2))  # > 64 tokens each
        engine.scheduler.step()
        steps += 1
        assert steps <= 160 // 8 + 4
    engine.scheduler.run_until_idle()


def test_decode_round_robin_past_the_sequence_budget(make_engine: Callable[..., TorchEngine],
                                                     contexts: dict[str, Context]) -> None:
    engine = make_engine(max_num_seqs=2)
    params = GenerationParams(max_new_tokens=5, ignore_eos=True)
    gens = [GenerateJob(contexts[w], params=params) for w in ("text", "image", "two_images", "text")]
    submit(engine, *gens)
    for _ in range(60):
        if all(g.future.done() for g in gens):
            break
        engine.scheduler.step()
    assert all(len(generation(g).token_ids) == 5 for g in gens)


# ---------------------------------------------------------------- failures belong to one job


def test_a_failing_forward_fails_its_job_alone(make_engine: Callable[..., TorchEngine], runner: Any,
                                               contexts: dict[str, Context],
                                               candidates: list[list[int]]) -> None:
    engine = make_engine()
    poison = [5, 6, 7, 8, 9]
    tap = Tap(engine, poison=poison)
    warm = [ScoreJob(contexts[w], candidates=candidates[:1]) for w in ("text", "image")]
    submit(engine, *warm)
    engine.scheduler.run_until_idle()
    gen = GenerateJob(contexts["two_images"], params=GenerationParams(max_new_tokens=6, ignore_eos=True))
    submit(engine, gen)
    engine.scheduler.step()  # its prefill
    bad = ScoreJob(contexts["text"], candidates=[candidates[1], poison])
    good = ScoreJob(contexts["image"], candidates=candidates)
    submit(engine, bad, good)
    engine.scheduler.step()  # the decode step alone: heavy work waits one light forward
    assert len(tap.forwards[-1]) == 1
    n = len(tap.forwards)
    engine.scheduler.step()  # one forward: a decode step, good's candidates and bad's; then one by one
    shared = tap.forwards[n]
    assert any(c.ids == poison for c in shared) and len(shared) == 1 + len(candidates) + 2
    assert len(tap.forwards) == n + 4
    engine.scheduler.run_until_idle()
    with pytest.raises(EngineError, match="poisoned"):
        bad.future.result()
    got = good.future.result()
    assert isinstance(got, list) and max_diff(got, runner.naive_score(contexts["image"], candidates)) <= TOL
    out = gen.future.result()
    assert isinstance(out, Generation) and len(out.token_ids) == 6


def test_a_bad_request_fails_before_any_work(make_engine: Callable[..., TorchEngine],
                                             contexts: dict[str, Context],
                                             candidates: list[list[int]]) -> None:
    engine = make_engine()
    tap = Tap(engine)
    two = contexts["two_images"]
    bad = ScoreJob(Context(two.token_ids, two.images[:1]), candidates=candidates)  # one image missing
    good = ScoreJob(contexts["text"], candidates=candidates)
    submit(engine, bad, good)
    engine.scheduler.run_until_idle()
    with pytest.raises(InvalidRequest, match="image"):
        bad.future.result()
    assert good.future.result() and len(tap.forwards) == 2  # prefill, then scoring: nothing for bad


def test_a_failing_generation_step_fails_that_generation_only(
        make_engine: Callable[..., TorchEngine], contexts: dict[str, Context]) -> None:
    class Broken:
        stop_ids = frozenset[int]()

        def mask(self, logits: torch.Tensor) -> None:
            raise RuntimeError("matcher crashed")

        def allows(self, token: int) -> bool:
            raise RuntimeError("matcher crashed")

    engine = make_engine()
    params = GenerationParams(max_new_tokens=4, ignore_eos=True)
    broken = GenerateJob(contexts["text"], params=params, grammar=Broken())  # type: ignore[arg-type]
    fine = GenerateJob(contexts["text"], params=params)
    submit(engine, broken, fine)
    engine.scheduler.run_until_idle()
    with pytest.raises(EngineError, match="matcher crashed"):
        broken.future.result()
    assert len(generation(fine).token_ids) == 4


# ---------------------------------------------------------------- context limit


async def test_context_too_long_is_refused_before_any_work(lm: LoadedModel, tok: Any,
                                                           contexts: dict[str, Context],
                                                           images: tuple[ImageRef, ...],
                                                           candidates: list[list[int]]) -> None:
    engine = TorchEngine(lm, EngineConfig(max_context=64))
    try:
        assert engine.runner.max_context == 64
        with pytest.raises(ContextTooLong) as e:
            await engine.score(long_context(tok, 80), candidates)
        assert e.value.status_code == 400 and e.value.code == "context_too_long"
        with pytest.raises(ContextTooLong):  # the context fits, the generation would not
            await engine.generate(long_context(tok, 40), GenerationParams(max_new_tokens=30))
        # few compact tokens, but the image expands to 35 pads: refused by the worker, unrun
        assert lm.image_token_id is not None
        ctx = Context((*tok.encode("Look:", add_special_tokens=False), lm.image_token_id,
                       *tok.encode(" what is it?" * 6, add_special_tokens=False)), images[:1])
        short = candidates[1:2]
        assert len(ctx) + len(short[0]) <= 64 < len(expand(lm, ctx, ImageCache()).ids) + len(short[0])
        with pytest.raises(ContextTooLong, match="images expanded"):
            await engine.score(ctx, short)
        assert engine.stats()["batches"] == 0
        assert await engine.score(long_context(tok, 30), candidates[1:2])  # within the limit: served
    finally:
        engine.scheduler.close()


def test_the_model_limit_is_the_default(lm: LoadedModel) -> None:
    engine = TorchEngine(lm, start=False)
    assert engine.runner.max_context == lm.max_positions == 32768
    engine.scheduler.close()


# ---------------------------------------------------------------- KV reserved for the candidates


def test_first_scoring_of_a_fresh_context_copies_no_kv(make_engine: Callable[..., TorchEngine],
                                                       contexts: dict[str, Context],
                                                       candidates: list[list[int]]) -> None:
    engine = make_engine()
    job = ScoreJob(contexts["image"], candidates=candidates)
    submit(engine, job)
    engine.scheduler.step()  # prefill
    assert job.prep is not None and job.prep.entry is not None
    kv = job.prep.entry.kv
    before = [k.data_ptr() for k in kv.keys]
    assert kv.capacity >= kv.length + sum(len(c) for c in candidates)
    engine.scheduler.run_until_idle()
    assert job.future.result()
    assert [k.data_ptr() for k in kv.keys] == before  # written in place: no reallocation, no copy


# ---------------------------------------------------------------- a turn's selection: one forward


@pytest.mark.parametrize("exact", ["off", "on"])
def test_an_observation_is_prefilled_and_scored_in_one_forward(
        make_engine: Callable[..., TorchEngine], tok: Any, runner: Any, contexts: dict[str, Context],
        images: tuple[ImageRef, ImageRef, ImageRef], candidates: list[list[int]], exact: str) -> None:
    """The next turn's context = the cached one + an observation (text and a thumbnail): its rest and
    the candidates run in ONE forward, the scores are exact, and the context is cached after it. With
    exact rows (``exact_drafts``) too, where the rest attends through fixed-shape calls and the
    candidates see it in its segment."""
    engine = make_engine(exact_drafts=exact)
    assert engine.runner.exact == (exact == "on")
    tap = Tap(engine)
    first = contexts["image"]
    submit(engine, ScoreJob(first, candidates=candidates))
    engine.scheduler.run_until_idle()
    n_first = len(expand(engine.lm, first, ImageCache()).ids)
    obs = tok.encode("</think> Observation: a tower of iron, 330 m.", add_special_tokens=False)
    ctx = first.extend(obs, (images[1],)).extend([tok.convert_tokens_to_ids("<|image_pad|>")])
    ctx = ctx.extend(tok.encode(" It is in Paris. <think>", add_special_tokens=False))
    job = ScoreJob(ctx, candidates=candidates)
    before = len(tap.forwards)
    submit(engine, job)
    engine.scheduler.run_until_idle()
    assert len(tap.forwards) == before + 1  # the rest and the candidates, together
    got = job.future.result()
    assert isinstance(got, list) and max_diff(got, runner.naive_score(ctx, candidates)) <= TOL
    assert got[0].cached_tokens == n_first  # the first turn's context came from the cache
    again = ScoreJob(ctx, candidates=candidates[:2])
    submit(engine, again)
    engine.scheduler.run_until_idle()
    res = again.future.result()
    assert isinstance(res, list) and res[0].cached_tokens == res[0].context_tokens  # cached whole
    assert max_diff(res, got[:2]) <= TOL
    # two such jobs in one forward (concurrent runs' turns): both exact
    a = ScoreJob(first.extend(obs[:5]), candidates=candidates)
    b = ScoreJob(first.extend(obs[5:]), candidates=candidates[1:])
    submit(engine, a, b)
    engine.scheduler.step()
    for j, c, cands in ((a, first.extend(obs[:5]), candidates), (b, first.extend(obs[5:]), candidates[1:])):
        out = j.future.result(timeout=0)
        assert isinstance(out, list) and max_diff(out, runner.naive_score(c, cands)) <= TOL


# ---------------------------------------------------------------- a shared prefix is prefilled once


def test_concurrent_contexts_share_a_long_prefix_once(make_engine: Callable[..., TorchEngine], tok: Any,
                                                      runner: Any, candidates: list[list[int]]) -> None:
    """Runs that start together with the same long system prompt: it is computed once."""
    engine = make_engine(prefill_chunk_size=32, max_decode_slowdown=0)
    tap = Tap(engine)
    prompt = long_context(tok, 200).token_ids
    ctxs = [Context(prompt + tuple(tok.encode(f" Question {i}: how tall is it?", add_special_tokens=False)))
            for i in range(3)]
    jobs = [ScoreJob(c, candidates=candidates[:2]) for c in ctxs]
    submit(engine, *jobs)
    engine.scheduler.run_until_idle()
    for c, j in zip(ctxs, jobs, strict=True):
        got = j.future.result()
        assert isinstance(got, list) and max_diff(got, runner.naive_score(c, candidates[:2])) <= TOL
    computed = sum(len(ch.ids) for f in tap.forwards for ch in f
                   if not ch.self_logprobs and len(ch.ids) > 1)  # prefill chunks (not candidates)
    tails = sum(len(c) - len(prompt) for c in ctxs[1:])
    assert computed <= len(ctxs[0]) + tails  # not 3 x 200
    for j in jobs[1:]:
        got = j.future.result()
        assert isinstance(got, list) and got[0].cached_tokens >= len(prompt)


@pytest.mark.parametrize("chunk", [1, 7, 16])
def test_chunked_prefill_is_exact_across_images(chunk: int, runner: Any, contexts: dict[str, Context],
                                                candidates: list[list[int]]) -> None:
    """Chunks never split an image (one larger than the chunk goes whole) and the result equals the
    naive forward, whatever the chunk size."""
    ctx = contexts["two_images"]
    p = runner.prepare(ctx, reserve=sum(len(c) for c in candidates))
    sizes = []
    while p.todo:
        c = runner.prefill_chunk(p, chunk)
        sizes.append(len(c.ids))
        for s0, s1 in p.exp.image_spans:
            assert not (p.reused < s0 < p.reused + len(c.ids) < s1)  # no image cut in two
        runner.commit(p, c, runner.forward([c])[0])
    assert max(sizes) > chunk and len(sizes) > 2  # the images went whole, the text in chunks
    got = runner.score([(runner.finish_prefill(p), candidates)])[0]
    assert max_diff(got, runner.naive_score(ctx, candidates)) <= TOL


def test_a_waiting_context_goes_on_when_its_leader_is_cancelled(make_engine: Callable[..., TorchEngine],
                                                                 tok: Any, runner: Any,
                                                                 candidates: list[list[int]]) -> None:
    engine = make_engine(max_num_batched_tokens=64, prefill_chunk_size=32, max_decode_slowdown=0)
    prompt = long_context(tok, 200).token_ids
    leader = ScoreJob(Context((*prompt, 5, 6)), candidates=candidates[:1])
    follower = ScoreJob(Context((*prompt, 7, 8, 9)), candidates=candidates[:1])
    submit(engine, leader, follower)
    engine.scheduler.step()
    assert engine.scheduler._prefills.jobs == [leader]  # the follower waits for the shared prefix
    leader.cancelled = True
    engine.scheduler.run_until_idle()
    assert leader.future.cancelled()
    got = follower.future.result()
    assert isinstance(got, list) and max_diff(got, runner.naive_score(follower.ctx, candidates[:1])) <= TOL


def _selection_and_action_prompt(engine: TorchEngine, tok: Any, cached: Context,
                                 candidates: list[list[int]]) -> tuple[ScoreJob, GenerateJob]:
    """Submits heavy work (a 200-token context prefilled whole, then scored) and a short action prompt
    on the ``cached`` context."""
    heavy = ScoreJob(long_context(tok, 200), candidates=candidates)
    more = tuple(tok.encode(" then", add_special_tokens=False))
    prompt = GenerateJob(Context(cached.token_ids + more), params=GenerationParams(max_new_tokens=4,
                                                                                   ignore_eos=True))
    submit(engine, heavy, prompt)
    return heavy, prompt


def test_decode_steps_and_action_prompts_go_before_heavy_work(make_engine: Callable[..., TorchEngine],
                                                              tok: Any, contexts: dict[str, Context],
                                                              candidates: list[list[int]]) -> None:
    """With heavy work waiting (a context prefilled whole, a selection), one forward carries the decode
    steps and short action prompts alone, the next one the heavy work too: a decode step waits for one
    heavy forward in two, not for every one."""
    engine = make_engine()
    tap = Tap(engine)
    submit(engine, ScoreJob(contexts["text"], candidates=candidates[:1]))
    engine.scheduler.run_until_idle()
    gen = GenerateJob(contexts["image"], params=GenerationParams(max_new_tokens=30, ignore_eos=True))
    submit(engine, gen)
    engine.scheduler.step()
    engine.scheduler.step()  # decoding
    heavy, prompt = _selection_and_action_prompt(engine, tok, contexts["text"], candidates)
    n = len(tap.forwards)
    engine.scheduler.step()
    assert len(tap.forwards[n]) == 2 and tap.tokens(n) <= 2 * 9  # gen's decode step, the action prompt
    engine.scheduler.step()
    assert tap.tokens(n + 1) > 200  # the heavy prefill, beside the decode steps
    engine.scheduler.run_until_idle()
    assert heavy.future.result() and generation(prompt).token_ids and generation(gen).token_ids


def test_an_action_prompt_alone_goes_before_heavy_work(make_engine: Callable[..., TorchEngine], tok: Any,
                                                        contexts: dict[str, Context],
                                                        candidates: list[list[int]]) -> None:
    """Nothing decoding, a selection and an action prompt waiting: the prompt gets a forward of its own
    first (it did ride in the selection's forward, ~15x its own cost)."""
    engine = make_engine(speculative_tokens=0)
    tap = Tap(engine)
    submit(engine, ScoreJob(contexts["text"], candidates=candidates[:1]))
    engine.scheduler.run_until_idle()
    heavy, prompt = _selection_and_action_prompt(engine, tok, contexts["text"], candidates)
    n = len(tap.forwards)
    engine.scheduler.step()
    assert len(tap.forwards[n]) == 1 and tap.tokens(n) <= 9  # the action prompt alone
    engine.scheduler.step()
    assert tap.tokens(n + 1) > 200  # then the heavy work, beside the prompt's first decode step
    engine.scheduler.run_until_idle()
    assert heavy.future.result() and generation(prompt).token_ids


@pytest.mark.parametrize("delay", [0.0, 1e6])
def test_max_heavy_delay_lets_light_forwards_go_first_for_so_long(
        make_engine: Callable[..., TorchEngine], tok: Any, contexts: dict[str, Context],
        candidates: list[list[int]], delay: float) -> None:
    """``max_heavy_delay``: heavy work waits light forwards until they have cost that many times a heavy
    forward (measured). 0: one light forward, then the heavy one; a large value: the generation
    decodes to its end first."""
    engine = make_engine(max_heavy_delay=delay, speculative_tokens=0)
    tap = Tap(engine)
    submit(engine, ScoreJob(long_context(tok, 200, "warm"), candidates=candidates))  # a heavy forward's cost
    engine.scheduler.run_until_idle()
    gen = GenerateJob(contexts["image"], params=GenerationParams(max_new_tokens=8, ignore_eos=True))
    submit(engine, gen)
    engine.scheduler.step()  # its prefill
    heavy = ScoreJob(long_context(tok, 200), candidates=candidates)
    submit(engine, heavy)
    n = len(tap.forwards)
    engine.scheduler.run_until_idle()
    sizes = [tap.tokens(i) for i in range(n, len(tap.forwards))]
    big = [i for i, t in enumerate(sizes) if t >= 200]  # the heavy job's context, prefilled whole
    assert len(big) == 1
    if delay == 0:
        assert big[0] == 1  # one light forward, then the heavy one (beside a decode step)
    else:  # the generation's 7 decode steps (its first token came from the prefill), then the heavy work
        assert sizes[:7] == [1] * 7 and big[0] == 7
    assert heavy.future.result() and len(generation(gen).token_ids) == 8


def test_a_selection_rides_with_decode_steps_a_slice_at_a_time(
        make_engine: Callable[..., TorchEngine], tok: Any, runner: Any, contexts: dict[str, Context],
        candidates: list[list[int]]) -> None:
    """``slice_selections``: while a generation decodes, a selection (its observation's rest, then its
    candidates) is scored a few candidates per forward, each forward carrying the decode step; the
    scores are the unsliced ones, and every candidate's KV is kept whole for the action that follows
    (an action on the chosen candidate decodes what it decodes on an engine that never sliced)."""
    first = contexts["text"]
    obs = tuple(tok.encode(" Observation: a tower of iron, 330 m. <think>", add_special_tokens=False))
    ctx = Context(first.token_ids + obs)
    action = GenerationParams(max_new_tokens=12, ignore_eos=True)
    outcome: dict[bool, tuple[list[CandidateScore], list[list[Generation]]]] = {}
    for sliced in (True, False):
        engine = make_engine(slice_selections=sliced, speculative_tokens=0)
        tap = Tap(engine)
        submit(engine, ScoreJob(first, candidates=candidates[:1]))
        engine.scheduler.run_until_idle()
        gen = GenerateJob(contexts["image"], params=GenerationParams(max_new_tokens=40, ignore_eos=True))
        submit(engine, gen)
        engine.scheduler.step()
        job = ScoreJob(ctx, candidates=candidates)
        submit(engine, job)
        n = len(tap.forwards)
        while not job.future.done():
            engine.scheduler.step()
        carried = [f for f in tap.forwards[n:] if any(len(c.ids) > 1 for c in f)]
        if sliced:
            assert len(carried) >= 2  # the candidates over several forwards ...
            assert all(any(len(c.ids) == 1 for c in f) for f in carried)  # ... each with the decode step
        else:
            assert len(carried) == 1
        got = job.future.result()
        assert isinstance(got, list) and max_diff(got, runner.naive_score(ctx, candidates)) <= TOL
        acts = [GenerateJob(Context(ctx.token_ids + tuple(c)), params=action) for c in candidates]
        submit(engine, *acts)
        engine.scheduler.run_until_idle()
        assert all(a.prep is not None and a.prep.cached_tokens == len(ctx.token_ids) + len(c)
                   for a, c in zip(acts, candidates, strict=True))  # each from its candidate's KV
        outcome[sliced] = (got, [[generation(a)] for a in acts])
        assert len(generation(gen).token_ids) == 40
    assert max_diff(outcome[True][0], outcome[False][0]) <= TOL
    assert [[g.token_ids for g in a] for a in outcome[True][1]] == \
        [[g.token_ids for g in a] for a in outcome[False][1]]


def test_an_exact_engine_scores_a_selection_whole(make_engine: Callable[..., TorchEngine], tok: Any,
                                                  contexts: dict[str, Context],
                                                  candidates: list[list[int]]) -> None:
    """``slice_selections`` is ignored by an exact engine: sliced, a candidate attends through another
    shape than in the whole selection, so its scores' last bits would follow timing."""
    engine = make_engine(slice_selections=True, speculative_tokens=0, exact_drafts="on")
    tap = Tap(engine)
    gen = GenerateJob(contexts["image"], params=GenerationParams(max_new_tokens=20, ignore_eos=True))
    submit(engine, gen)
    engine.scheduler.step()
    job = ScoreJob(contexts["text"], candidates=candidates)
    submit(engine, job)
    n = len(tap.forwards)
    engine.scheduler.run_until_idle()
    scored = [f for f in tap.forwards[n:] if any(c.self_logprobs for c in f)]
    assert len(scored) == 1 and sum(c.self_logprobs for c in scored[0]) == len(candidates)
    assert job.future.result() and len(generation(gen).token_ids) == 20


def test_a_heavy_prefill_arriving_during_slices_waits_one_light_forward(
        make_engine: Callable[..., TorchEngine], tok: Any, contexts: dict[str, Context],
        candidates: list[list[int]]) -> None:
    """``slice_selections``: a context to prefill whole that arrives while a selection goes in slices
    waits one light forward (the decode step and a slice), as it does without slicing; the slices that
    ran before it came do not count as its delay."""
    engine = make_engine(slice_selections=True, speculative_tokens=0)
    tap = Tap(engine)
    first = contexts["text"]
    submit(engine, ScoreJob(first, candidates=candidates[:1]))
    engine.scheduler.run_until_idle()
    gen = GenerateJob(contexts["image"], params=GenerationParams(max_new_tokens=40, ignore_eos=True))
    submit(engine, gen)
    engine.scheduler.step()
    obs = tuple(tok.encode(" Observation: a tower of iron, 330 m. <think>", add_special_tokens=False))
    job = ScoreJob(Context(first.token_ids + obs), candidates=candidates)
    submit(engine, job)
    engine.scheduler.step()
    engine.scheduler.step()
    assert not job.future.done()  # two slices so far, each beside the decode step
    heavy = ScoreJob(long_context(tok, 200), candidates=candidates)
    submit(engine, heavy)
    n = len(tap.forwards)
    engine.scheduler.step()
    assert tap.tokens(n) < 200 and any(len(c.ids) == 1 for c in tap.forwards[n])  # a light forward first
    engine.scheduler.step()
    assert tap.tokens(n + 1) > 200  # then the heavy prefill, beside the decode step
    engine.scheduler.run_until_idle()
    assert job.future.result() and heavy.future.result() and len(generation(gen).token_ids) == 40

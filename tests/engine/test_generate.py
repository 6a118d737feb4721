"""Decoding: greedy equals a plain transformers loop (with and without reused KV), stop strings, length,
seeded sampling, concurrent runs batched by the scheduler, cancellation, bf16."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from ssr_server.core.protocol import Context, Generation, GenerationParams, ImageRef
from ssr_server.engine.torch.config import EngineConfig
from ssr_server.engine.torch.engine import TorchEngine
from ssr_server.engine.torch.loader import LoadedModel

FORCED = "</think>\n<answer>"


def expanded(lm: LoadedModel, ctx: Context) -> tuple[list[int], dict[str, torch.Tensor]]:
    """The context as transformers' own Qwen3-VL path wants it (independent of the engine's expand)."""
    pad = lm.image_token_id
    if not ctx.images:
        return list(ctx.token_ids), {}
    assert lm.image_processor is not None and pad is not None
    px = lm.image_processor(images=[r.image for r in ctx.images], return_tensors="pt")
    counts = iter((px["image_grid_thw"].prod(dim=1) // lm.merge_size**2).tolist())
    ids: list[int] = []
    for t in ctx.token_ids:
        ids.extend([t] * int(next(counts)) if t == pad else [t])
    return ids, {"pixel_values": px["pixel_values"], "image_grid_thw": px["image_grid_thw"]}


@torch.inference_mode()
def reference_greedy(lm: LoadedModel, ctx: Context, steps: int) -> list[int]:
    """A plain loop: one full transformers forward over the whole sequence per step, argmax."""
    ids, extra = expanded(lm, ctx)
    out: list[int] = []
    for _ in range(steps):
        x = torch.tensor([ids])
        kwargs: dict[str, Any] = dict(extra)
        if extra:
            kwargs["mm_token_type_ids"] = torch.eq(x, int(lm.image_token_id or -1)).to(torch.int32)
        logits = lm.model(input_ids=x, use_cache=False, **kwargs).logits[0, -1]
        nxt = int(torch.argmax(logits))
        out.append(nxt)
        ids.append(nxt)
    return out


def greedy(n: int, **kw: Any) -> GenerationParams:
    return GenerationParams(max_new_tokens=n, **kw)


def assert_cached_kv_exact(engine: TorchEngine, ctx: Context, candidates: list[list[int]]) -> None:
    """``ctx`` is wholly in the engine's prefix cache, and its KV / last logits / next position are
    exact: scoring on that entry equals the naive reference. (Greedy tokens alone hardly notice small
    KV errors in the tiny model; log-probabilities do.) Call only while the engine is idle."""
    runner = engine.runner
    p = runner.prepare(ctx)
    assert p.entry is not None, "expected the whole context in the prefix cache"
    got = runner.score([(p.entry, candidates)])[0]
    want = runner.naive_score(ctx, candidates)
    worst = max(abs(a - b) for x, y in zip(got, want, strict=True)
                for a, b in zip(x.token_logprobs, y.token_logprobs, strict=True))
    assert worst <= 1e-4


# ---------------------------------------------------------------- greedy correctness


@pytest.mark.parametrize("which", ["text", "image", "two_images"])
async def test_greedy_after_scoring_reuses_candidate_kv(
        which: str, lm: LoadedModel, tok: Any, contexts: dict[str, Context], candidates: list[list[int]],
        fresh_engine: TorchEngine) -> None:
    ctx = contexts[which]
    scores = await fresh_engine.score(ctx, candidates)
    chosen = candidates[max(range(len(scores)), key=lambda i: scores[i].logprob_sum)]
    full = ctx.extend(chosen + tok.encode(FORCED, add_special_tokens=False))
    g = await fresh_engine.generate(full, greedy(10))

    n_ctx = len(expanded(lm, ctx)[0])
    assert g.cached_tokens == n_ctx + len(chosen) > len(ctx)  # context AND candidate KV reused
    assert g.prompt_tokens == len(expanded(lm, full)[0])

    cold_engine = TorchEngine(lm)
    try:
        cold = await cold_engine.generate(full, greedy(10))
    finally:
        cold_engine.scheduler.close()
    assert cold.cached_tokens == 0
    assert cold.token_ids == g.token_ids
    assert list(g.token_ids) == reference_greedy(lm, full, len(g.token_ids))
    assert g.finish_reason == ("length" if len(g.token_ids) == 10 else "eos")
    # the finished sequence (all but the last sampled token) is cached with exact KV
    assert_cached_kv_exact(fresh_engine, full.extend(g.token_ids[:-1]), candidates[:2])


@pytest.mark.parametrize("which", ["text", "two_images"])
@pytest.mark.parametrize("extra", ["", FORCED])
def test_candidate_kv_reuse_is_exact(which: str, extra: str, tok: Any, runner: Any,
                                     contexts: dict[str, Context], candidates: list[list[int]]) -> None:
    """The KV kept for a scored candidate, reused under a longer context, equals recomputing it."""
    ctx = contexts[which]
    p = runner.prepare(ctx)
    runner.prefill([p])
    runner.score([(p.entry, candidates)])
    chosen = candidates[2]
    nxt = ctx.extend(chosen + tok.encode(extra, add_special_tokens=False))
    q = runner.prepare(nxt, reuse_candidates=True)
    assert q.reused == len(p.exp.ids) + len(chosen)
    runner.prefill([q])
    assert q.entry is not None
    got = runner.score([(q.entry, candidates)])[0]
    want = runner.naive_score(nxt, candidates)
    worst = max(abs(a - b) for x, y in zip(got, want, strict=True)
                for a, b in zip(x.token_logprobs, y.token_logprobs, strict=True))
    assert worst <= 1e-4


async def test_generation_continues_from_a_cached_generation(
        lm: LoadedModel, contexts: dict[str, Context], fresh_engine: TorchEngine) -> None:
    """A finished generation's KV is cached: the next turn (prompt + output + more) reuses it."""
    ctx = contexts["image"]
    first = await fresh_engine.generate(ctx, greedy(6))
    nxt = ctx.extend([*first.token_ids, *first.token_ids[:2]])
    second = await fresh_engine.generate(nxt, greedy(6))
    assert second.cached_tokens >= len(expanded(lm, ctx)[0]) + len(first.token_ids) - 1
    assert list(second.token_ids) == reference_greedy(lm, nxt, len(second.token_ids))


# ---------------------------------------------------------------- stop / length / eos


@pytest.fixture(scope="module")
def greedy_run(engine: TorchEngine, contexts: dict[str, Context]) -> Generation:
    return asyncio.run(_generate(engine, contexts["image"], greedy(24)))


async def _generate(engine: TorchEngine, ctx: Context, params: GenerationParams) -> Generation:
    return await engine.generate(ctx, params)


def _pick_stop(tok: Any, tokens: tuple[int, ...]) -> tuple[int, str]:
    """A token k >= 2 whose text is clean ASCII and first occurs exactly where token k starts."""
    full = tok.decode(tokens, skip_special_tokens=False)
    for k in range(2, len(tokens)):
        s = tok.decode(tokens[k : k + 1], skip_special_tokens=False)
        before = tok.decode(tokens[:k], skip_special_tokens=False)
        if s.strip() and s.isascii() and "\ufffd" not in before and full.find(s) == len(before):
            return k, s
    raise AssertionError(f"no usable stop string in {full!r}")


async def test_stop_string_cuts_the_text(engine: TorchEngine, tok: Any, contexts: dict[str, Context],
                                         greedy_run: Generation) -> None:
    assert greedy_run.finish_reason == "length" and len(greedy_run.token_ids) == 24
    k, stop = _pick_stop(tok, greedy_run.token_ids)
    g = await engine.generate(contexts["image"], greedy(24, stop=("never-in-this-text", stop)))
    assert g.finish_reason == "stop" and g.stop_text == stop
    assert g.token_ids == greedy_run.token_ids[: k + 1]  # stopped right at the token that completed it
    assert g.text == tok.decode(greedy_run.token_ids[:k], skip_special_tokens=False)
    assert stop not in g.text


async def test_stop_string_that_never_occurs(engine: TorchEngine, contexts: dict[str, Context],
                                             greedy_run: Generation) -> None:
    g = await engine.generate(contexts["image"], greedy(24, stop=("never-in-this-text",)))
    assert g.finish_reason == "length" and g.token_ids == greedy_run.token_ids and g.stop_text is None


@pytest.mark.parametrize("n", [1, 3])
async def test_max_tokens_gives_length(n: int, engine: TorchEngine, tok: Any, contexts: dict[str, Context],
                                       greedy_run: Generation) -> None:
    g = await engine.generate(contexts["image"], greedy(n))
    assert g.finish_reason == "length"
    assert g.token_ids == greedy_run.token_ids[:n]
    assert g.text == tok.decode(g.token_ids, skip_special_tokens=False)


async def test_eos_token_ends_and_is_not_in_text(lm: LoadedModel, tok: Any, contexts: dict[str, Context],
                                                 greedy_run: Generation) -> None:
    tokens = greedy_run.token_ids
    k = next(i for i in range(3, len(tokens)) if tokens[i] not in tokens[:i])
    engine = TorchEngine(lm)
    engine.scheduler.decoder.eos_ids = frozenset({tokens[k]})  # pretend that token is the model's EOS
    try:
        g = await engine.generate(contexts["image"], greedy(24))
        through = await engine.generate(contexts["image"], greedy(24, ignore_eos=True))
    finally:
        engine.scheduler.close()
    assert g.finish_reason == "eos" and g.token_ids == tokens[: k + 1]
    assert g.text == tok.decode(tokens[:k], skip_special_tokens=False)
    assert through.finish_reason == "length" and through.token_ids == tokens  # benchmarks: exactly N


async def test_invalid_generation_params(engine: TorchEngine, contexts: dict[str, Context]) -> None:
    from ssr_server.core.errors import InvalidRequest

    with pytest.raises(InvalidRequest):
        await engine.generate(contexts["text"], greedy(0))
    with pytest.raises(InvalidRequest):
        await engine.generate(Context(contexts["image"].token_ids, ()), greedy(2))


# ---------------------------------------------------------------- sampling


async def test_seeded_sampling(engine: TorchEngine, contexts: dict[str, Context]) -> None:
    ctx = contexts["text"]

    async def sample(seed: int, **kw: Any) -> tuple[int, ...]:
        g = await engine.generate(ctx, GenerationParams(max_new_tokens=12, temperature=1.0, seed=seed, **kw))
        return g.token_ids

    assert await sample(7) == await sample(7)
    assert await sample(7, top_k=20, top_p=0.9) == await sample(7, top_k=20, top_p=0.9)
    outputs = {await sample(s) for s in range(5)}
    assert len(outputs) > 1
    greedy_tokens = (await engine.generate(ctx, greedy(12))).token_ids
    assert await sample(3, top_k=1) == greedy_tokens  # top-1 sampling is greedy
    assert await sample(4, top_p=1e-6) == greedy_tokens  # so is a vanishing nucleus


async def test_a_vanishing_temperature_is_greedy_not_nan(engine: TorchEngine,
                                                        contexts: dict[str, Context]) -> None:
    """logits / 1e-197 are infinities whose softmax is NaN: a client's tiny temperature gave a 500."""
    ctx = contexts["text"]
    greedy_tokens = (await engine.generate(ctx, greedy(12))).token_ids
    for t in (1e-197, 1e-30, 5e-7):
        g = await engine.generate(ctx, GenerationParams(max_new_tokens=12, temperature=t, seed=1))
        assert g.token_ids == greedy_tokens, t


# ---------------------------------------------------------------- concurrency


async def test_concurrent_generations_are_batched(lm: LoadedModel, make_context: Callable[..., Context],
                                                  images: tuple[ImageRef, ...]) -> None:
    questions = ["What is the name of this landmark?", "When was it built?", "How tall is it?",
                 "Who painted this?", "Which country?", "What animal is shown?",
                 "What colour is the car?", "How many legs does it have?"]
    ctxs = [make_context(q, images[i % 3 : i % 3 + 1] if i % 2 else ()) for i, q in enumerate(questions)]
    params = greedy(10)
    together = TorchEngine(lm)
    alone = TorchEngine(lm)
    try:
        concurrent = await asyncio.gather(*(together.generate(c, params) for c in ctxs))
        sequential = [await alone.generate(c, params) for c in ctxs]
        assert together.stats()["max_batch"] > 1
        assert alone.stats()["max_batch"] == 1
    finally:
        together.scheduler.close()
        alone.scheduler.close()
    assert [g.token_ids for g in concurrent] == [g.token_ids for g in sequential]
    assert len({g.token_ids for g in concurrent}) > 1
    # the KV decoded in shared forwards (several pasts side by side) is exact
    probe = [[5, 6, 7], [40, 41]]
    for c, g in list(zip(ctxs, concurrent, strict=True))[:3]:
        assert_cached_kv_exact(together, c.extend(g.token_ids[:-1]), probe)


async def test_cancelling_a_generation_stops_it(lm: LoadedModel, contexts: dict[str, Context]) -> None:
    engine = TorchEngine(lm)
    try:
        task = asyncio.create_task(engine.generate(contexts["text"], greedy(5000)))
        deadline = time.monotonic() + 20
        while engine.stats()["batches"] < 5:
            assert time.monotonic() < deadline and not task.done()
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # the worker drops the run at its next iteration and goes idle
        before = -1
        while before != engine.stats()["batches"]:
            assert time.monotonic() < deadline
            before = engine.stats()["batches"]
            await asyncio.sleep(0.1)
        assert before < 2500  # far fewer than the 5000 steps it asked for
        g = await engine.generate(contexts["text"], greedy(4))  # still serving
        assert len(g.token_ids) == 4
    finally:
        engine.scheduler.close()


async def test_closed_engine_refuses_work(lm: LoadedModel, contexts: dict[str, Context]) -> None:
    from ssr_server.core.errors import EngineError

    engine = TorchEngine(lm)
    assert await engine.ready()
    await engine.close()
    assert not await engine.ready()
    with pytest.raises(EngineError):
        await engine.generate(contexts["text"], greedy(2))


# ---------------------------------------------------------------- bf16


def finite_logprob(x: float) -> bool:
    """A log-probability: finite (``x == x`` alone lets -inf through) and at most 0."""
    return math.isfinite(x) and x <= 0


def test_finite_logprob_refuses_nan_and_infinities() -> None:
    assert finite_logprob(0.0) and finite_logprob(-12.5)
    assert not any(finite_logprob(x) for x in (float("-inf"), float("nan"), float("inf"), 0.25))


async def test_bf16_engine(tiny_dir: Path, contexts: dict[str, Context], candidates: list[list[int]],
                           engine: TorchEngine) -> None:
    bf16 = TorchEngine(str(tiny_dir), EngineConfig(dtype="bf16"))
    try:
        assert bf16.lm.dtype == torch.bfloat16
        assert next(bf16.lm.model.parameters()).dtype == torch.bfloat16
        ctx = contexts["image"]
        g = await bf16.generate(ctx, greedy(8))
        assert 1 <= len(g.token_ids) <= 8 and g.finish_reason in ("length", "eos")
        got = await bf16.score(ctx, candidates)
        want = await engine.score(ctx, candidates)  # fp32
        for a, b in zip(got, want, strict=True):
            assert a.num_tokens == b.num_tokens
            assert all(finite_logprob(x) for x in a.token_logprobs)
            assert abs(a.logprob_sum - b.logprob_sum) <= 0.05 * abs(b.logprob_sum) + 1.0
    finally:
        bf16.scheduler.close()

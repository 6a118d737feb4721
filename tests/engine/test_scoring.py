"""Packed candidate scoring equals the naive reference (one plain transformers forward per candidate).

fp32 throughout, tolerance 1e-4 on every per-token log-probability. Covers text, one-image and
two-image contexts, candidate shapes, contexts served from the prefix cache (whole or as a prefix of
a longer context), batching two contexts into one forward, and random candidate sets.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ssr_server.core.errors import InvalidRequest
from ssr_server.core.protocol import CandidateScore, Context, ImageRef
from ssr_server.engine.torch.cpu_bf16 import install_fp32_matmul
from ssr_server.engine.torch.engine import TorchEngine
from ssr_server.engine.torch.loader import LoadedModel
from ssr_server.engine.torch.prefix_cache import PrefixCache
from ssr_server.engine.torch.runner import ModelRunner
from ssr_server.engine.torch.scoring import token_logprobs

TOL = 1e-4


def max_diff(a: Sequence[CandidateScore], b: Sequence[CandidateScore]) -> float:
    assert len(a) == len(b)
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        assert x.num_tokens == y.num_tokens
        worst = max([worst, *(abs(p - q) for p, q in zip(x.token_logprobs, y.token_logprobs, strict=True))])
    return worst


def packed(runner: ModelRunner, ctx: Context, cands: list[list[int]]) -> list[CandidateScore]:
    return runner.score_context(ctx, cands)


def assert_matches_naive(runner: ModelRunner, ctx: Context, cands: list[list[int]]) -> list[CandidateScore]:
    got = packed(runner, ctx, cands)
    want = runner.naive_score(ctx, cands)
    assert max_diff(got, want) <= TOL
    return got


# ---------------------------------------------------------------- packed == naive


@pytest.mark.parametrize("which", ["text", "image", "two_images"])
def test_packed_matches_naive(which: str, runner: ModelRunner, contexts: dict[str, Context],
                              candidates: list[list[int]]) -> None:
    assert len({len(c) for c in candidates}) == len(candidates)  # all lengths differ
    got = assert_matches_naive(runner, contexts[which], candidates)
    assert [s.num_tokens for s in got] == [len(c) for c in candidates]
    assert len({round(s.logprob_sum, 3) for s in got}) == len(got)  # the model has opinions


def test_contexts_really_hold_images(lm: LoadedModel, runner: ModelRunner, contexts: dict[str, Context],
                                     candidates: list[list[int]]) -> None:
    """The image contexts expand to many pad tokens, and the pixels change the scores."""
    pad = lm.image_token_id
    assert sum(t == pad for t in contexts["two_images"].token_ids) == 2
    p = runner.prepare(contexts["two_images"])
    assert len(p.exp.ids) > len(contexts["two_images"]) + 40
    ctx = contexts["image"]
    other = Context(ctx.token_ids, (contexts["two_images"].images[1],))
    a, b = packed(runner, ctx, candidates), packed(runner, other, candidates)
    assert max_diff(a, b) > 1e-3


@pytest.mark.parametrize("which", ["text", "image"])
def test_single_candidate(which: str, runner: ModelRunner, contexts: dict[str, Context],
                          candidates: list[list[int]]) -> None:
    assert_matches_naive(runner, contexts[which], [candidates[0]])


@pytest.mark.parametrize("which", ["text", "two_images"])
def test_single_token_candidates(which: str, runner: ModelRunner, contexts: dict[str, Context],
                                 candidates: list[list[int]]) -> None:
    got = assert_matches_naive(runner, contexts[which], [[candidates[0][0]], [17], candidates[2]])
    assert got[0].num_tokens == 1
    # a one-token candidate is predicted by the context's last logits alone
    again = assert_matches_naive(runner, contexts[which], [[candidates[0][0]]])
    assert again[0].token_logprobs == pytest.approx(got[0].token_logprobs, abs=TOL)


def test_repeated_candidates_and_padding_ids(lm: LoadedModel, runner: ModelRunner,
                                             contexts: dict[str, Context],
                                             candidates: list[list[int]]) -> None:
    vocab = int(lm.model.config.text_config.vocab_size)
    cands = [candidates[1], candidates[1], [vocab - 1, 0, 5]]  # duplicates; an id past len(tokenizer)
    got = assert_matches_naive(runner, contexts["image"], cands)
    assert got[0].token_logprobs == pytest.approx(got[1].token_logprobs, abs=1e-5)


# ---------------------------------------------------------------- prefix cache


@pytest.mark.parametrize("which", ["text", "image"])
def test_second_call_is_served_from_the_cache(which: str, runner: ModelRunner, contexts: dict[str, Context],
                                              candidates: list[list[int]]) -> None:
    ctx = contexts[which]
    first = packed(runner, ctx, candidates)
    p = runner.prepare(ctx)
    assert p.entry is not None and p.todo == 0 and p.cached_tokens == len(p.exp.ids)
    second = runner.score([(p.entry, candidates)])[0]
    assert max_diff(first, second) == 0.0
    assert max_diff(second, runner.naive_score(ctx, candidates)) <= TOL
    assert runner.cache.hits >= 1


@pytest.mark.parametrize("which", ["text", "image", "two_images"])
def test_extended_context_reuses_cached_prefix(which: str, runner: ModelRunner, tok: object,
                                               contexts: dict[str, Context], candidates: list[list[int]],
                                               images: tuple[ImageRef, ...]) -> None:
    """Turn t+1 = turn t + chosen rationale + action + observation (with a new image)."""
    ctx = contexts[which]
    packed(runner, ctx, candidates)
    n_ctx = len(runner.prepare(ctx).exp.ids)
    obs = tok.encode(  # type: ignore[attr-defined]
        "</think>\n<image_search></image_search><|im_end|>\n<|im_start|>user\n<tool_response>\n"
        "1. Title - text. Image: <|vision_start|><|image_pad|><|vision_end|>\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n", add_special_tokens=False)
    ctx2 = ctx.extend(candidates[0] + obs, images=(images[2],))
    p = runner.prepare(ctx2)
    assert p.entry is None and p.reused == n_ctx and p.todo > 0
    runner.prefill([p])
    assert p.entry is not None
    got = runner.score([(p.entry, candidates)])[0]
    assert max_diff(got, runner.naive_score(ctx2, candidates)) <= TOL


def test_diverging_context_reuses_common_prefix(runner: ModelRunner, make_context: Callable[..., Context],
                                                images: tuple[ImageRef, ...],
                                                candidates: list[list[int]]) -> None:
    """A context that shares only part of a cached one reuses that part (never half an image)."""
    a = make_context("Which country is this from? Answer briefly.", images[:1])
    b = make_context("Which country is this from? Answer in one word.", images[:1])
    c = make_context("Which country is this from? Answer briefly.", images[1:2])  # other pixels
    packed(runner, a, candidates)
    for ctx in (b, c):
        p = runner.prepare(ctx)
        assert 0 < p.reused < len(p.exp.ids) and p.entry is None
        span = p.exp.image_spans[0]
        assert p.reused <= span[0] or p.reused >= span[1]
        if ctx is c:
            assert p.reused <= span[0]  # the different image is not reused
        runner.prefill([p])
        assert p.entry is not None
        got = runner.score([(p.entry, candidates)])[0]
        assert max_diff(got, runner.naive_score(ctx, candidates)) <= TOL


# ---------------------------------------------------------------- batching


def test_two_contexts_in_one_forward(runner: ModelRunner, contexts: dict[str, Context],
                                     candidates: list[list[int]]) -> None:
    ctx_a, ctx_b = contexts["image"], contexts["two_images"]
    cands_a, cands_b = candidates[:3], [candidates[3], [5], candidates[1]]
    pa, pb = runner.prepare(ctx_a), runner.prepare(ctx_b)
    runner.prefill([pa, pb])  # both prefills in one forward too
    assert pa.entry is not None and pb.entry is not None
    both = runner.score([(pa.entry, cands_a), (pb.entry, cands_b)])
    alone = ModelRunner(runner.lm, PrefixCache(1 << 28))
    assert max_diff(both[0], packed(alone, ctx_a, cands_a)) <= TOL
    assert max_diff(both[1], packed(alone, ctx_b, cands_b)) <= TOL
    assert max_diff(both[1], runner.naive_score(ctx_b, cands_b)) <= TOL


def test_same_context_twice_in_one_forward(runner: ModelRunner, contexts: dict[str, Context],
                                           candidates: list[list[int]]) -> None:
    p = runner.prepare(contexts["text"])
    runner.prefill([p])
    assert p.entry is not None
    a, b = runner.score([(p.entry, candidates[:2]), (p.entry, candidates[2:])])
    assert max_diff(a + b, runner.naive_score(contexts["text"], candidates)) <= TOL


# ---------------------------------------------------------------- random candidate sets


@st.composite
def candidate_sets(draw: st.DrawFn) -> list[list[int]]:
    n = draw(st.integers(min_value=1, max_value=6))
    return [draw(st.lists(st.integers(min_value=0, max_value=1 << 30), min_size=1, max_size=12))
            for _ in range(n)]


@pytest.fixture(scope="module")
def warm_runner(lm: LoadedModel) -> ModelRunner:
    return ModelRunner(lm, PrefixCache(1 << 28))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=candidate_sets(), which=st.sampled_from(["text", "image", "two_images"]))
def test_random_candidate_sets(raw: list[list[int]], which: str, warm_runner: ModelRunner,
                               lm: LoadedModel, contexts: dict[str, Context]) -> None:
    vocab = warm_runner.vocab_size
    # any id of the embedding table except the image placeholder (a candidate cannot carry an image)
    cands = [[t % vocab for t in c] for c in raw]
    cands = [[t if t != lm.image_token_id else t + 1 for t in c] for c in cands]
    ctx = contexts[which]
    p = warm_runner.prepare(ctx)
    warm_runner.prefill([p])
    assert p.entry is not None
    got = warm_runner.score([(p.entry, cands)])[0]
    assert max_diff(got, warm_runner.naive_score(ctx, cands)) <= TOL


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(jobs=st.lists(st.tuples(st.sampled_from(["text", "image", "two_images"]), candidate_sets()),
                     min_size=2, max_size=3))
def test_random_batches_of_jobs(jobs: list[tuple[str, list[list[int]]]], warm_runner: ModelRunner,
                                lm: LoadedModel, contexts: dict[str, Context]) -> None:
    """Several jobs in one forward, the same context possibly twice (then its KV is shared, not
    written in place): each equals the naive reference."""
    vocab = warm_runner.vocab_size
    todo = []
    for which, raw in jobs:
        cands = [[(t % vocab) if t % vocab != lm.image_token_id else 0 for t in c] for c in raw]
        p = warm_runner.prepare(contexts[which])
        warm_runner.prefill([p])
        assert p.entry is not None
        todo.append((which, p.entry, cands))
    outs = warm_runner.score([(e, c) for _, e, c in todo])
    for (which, _, cands), got in zip(todo, outs, strict=True):
        assert max_diff(got, warm_runner.naive_score(contexts[which], cands)) <= TOL


# ---------------------------------------------------------------- the engine API


async def test_engine_scores_like_the_runner(fresh_engine: TorchEngine, runner: ModelRunner,
                                             contexts: dict[str, Context],
                                             candidates: list[list[int]]) -> None:
    ctx = contexts["two_images"]
    first = await fresh_engine.score(ctx, candidates)
    second = await fresh_engine.score(ctx, candidates)
    want = runner.naive_score(ctx, candidates)
    assert max_diff(first, want) <= TOL and max_diff(second, want) <= TOL
    n = len(runner.prepare(ctx).exp.ids)
    assert all(s.cached_tokens == n for s in second)
    assert fresh_engine.stats()["prefix_cache_hits"] >= 1


async def test_cached_tokens_count_only_what_the_cache_held(fresh_engine: TorchEngine, runner: ModelRunner,
                                                            make_context: Callable[..., Context],
                                                            contexts: dict[str, Context],
                                                            candidates: list[list[int]]) -> None:
    ctx = contexts["image"]
    n = len(runner.prepare(ctx).exp.ids)
    cold = await fresh_engine.score(ctx, candidates)
    assert all(s.cached_tokens == 0 and s.context_tokens == n for s in cold)
    warm = await fresh_engine.score(ctx, candidates)
    assert all(s.cached_tokens == n and s.context_tokens == n for s in warm)
    longer = ctx.extend(candidates[0])  # a cached prefix plus new tokens
    part = await fresh_engine.score(longer, candidates[1:3])
    assert all(s.cached_tokens == n and s.context_tokens == n + len(candidates[0]) for s in part)


@pytest.mark.parametrize("bad", [[], [[]], [[1, 2], []], [[-1]], [[1 << 20]], "vocab", "image_pad"])
async def test_invalid_candidates(bad: object, engine: TorchEngine, contexts: dict[str, Context]) -> None:
    """Empty sets or candidates, ids outside the embedding table, and image placeholders (a candidate
    cannot carry an image: the packed path would silently score the pad as text) are refused."""
    cands = {"vocab": [[engine.runner.vocab_size]],
             "image_pad": [[5, engine.lm.image_token_id, 7]]}.get(str(bad), bad)
    with pytest.raises(InvalidRequest):
        await engine.score(contexts["text"], cands)  # type: ignore[arg-type]


@pytest.mark.parametrize("case", ["missing_image", "extra_image", "pad_without_image"])
async def test_image_count_mismatch(case: str, engine: TorchEngine, contexts: dict[str, Context],
                                    images: tuple[ImageRef, ...], candidates: list[list[int]]) -> None:
    two = contexts["two_images"]
    ctx = {
        "missing_image": Context(two.token_ids, two.images[:1]),
        "extra_image": Context(contexts["text"].token_ids, (images[0],)),
        "pad_without_image": Context(contexts["image"].token_ids, ()),
    }[case]
    with pytest.raises(InvalidRequest, match="image"):
        await engine.score(ctx, candidates)
    # the worker survives a bad request
    assert len(await engine.score(contexts["text"], candidates[:1])) == 1


async def test_empty_context_is_invalid(engine: TorchEngine, candidates: list[list[int]]) -> None:
    with pytest.raises(InvalidRequest):
        await engine.score(Context(()), candidates)


# ---------------------------------------------------------------- the scoring bench (smoke)


def test_scoring_bench_smoke(tiny_dir: Path, tmp_path: Path) -> None:
    from ssr_server.bench.scoring import format_table, run_scoring_bench

    out = tmp_path / "bench.json"
    r = run_scoring_bench(str(tiny_dir), None, "fp32", 1, str(out), threads=1, freeform_tokens=8,
                          context_tokens=200)
    assert json.loads(out.read_text())["packed_ms"] == r["packed_ms"]
    assert r["context_tokens"] >= 200 and r["context_images"] == 1
    assert r["candidate_tokens"] and all(n > 0 for n in r["candidate_tokens"])
    assert r["freeform_tokens"] == 8 and r["max_abs_diff"] <= TOL
    assert all(r[k] > 0 for k in ("naive_ms", "packed_ms", "packed_cached_ms", "freeform_ms"))
    table = format_table(r)
    assert "packed/naive" in table and "PASS" in table
    with pytest.raises(NotImplementedError):
        run_scoring_bench(None, None, "fp32", 1, None, engine="sglang")


@pytest.mark.parametrize("case", ["fp32", "fp32 with bias", "bf16", "bf16 routed to fp32"])
def test_token_logprobs_blockwise_equals_log_softmax(case: str) -> None:
    """The forward's own log-probabilities (a block of the vocabulary at a time, online log-sum-exp) are
    the log-softmax's of the head's own logits, for any block size; the hidden states are left as they
    were. A bf16 head that ``cpu_bf16`` routes through the fp32 kernel multiplies in fp32 here too."""
    g = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16 if case.startswith("bf16") else torch.float32
    head = torch.nn.Linear(24, 50, bias=case == "fp32 with bias").to(dtype)
    if case == "bf16 routed to fp32":
        assert install_fp32_matmul(torch.nn.Sequential(head), min_rows=8) == 1
    hidden = torch.randn(37, 24, generator=g).to(dtype)
    before = hidden.clone()
    targets = torch.randint(0, 50, (37,), generator=g)
    logits = head(hidden).float() if case != "bf16 routed to fp32" else \
        torch.nn.functional.linear(hidden.float(), head.weight.float())  # the route's fp32, unrounded
    ref = torch.log_softmax(logits, dim=-1).gather(1, targets.view(-1, 1))[:, 0]
    for block in (1, 7, 16, 50, 4096):  # one word at a time, blocks with a short last one, all at once
        got = token_logprobs(head, hidden, targets, vocab_block=block)
        assert got.dtype == torch.float32 and got.shape == (37,)
        assert torch.allclose(got, ref, atol=1e-5), (block, (got - ref).abs().max())
    assert torch.equal(hidden, before)

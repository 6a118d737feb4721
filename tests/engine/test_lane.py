"""The prefill lane: heavy forwards (score jobs, contexts prefilled whole) on a second thread while the
scheduler's thread goes on with decode steps; the same results as without it, failures kept to their
jobs, and nothing left hanging when the engine closes with a batch on the lane."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any

import pytest

from ssr_server.core.errors import EngineError
from ssr_server.core.protocol import CandidateScore, Context, Generation, GenerationParams, Grammar
from ssr_server.engine.torch.config import EngineConfig
from ssr_server.engine.torch.engine import TorchEngine
from ssr_server.engine.torch.jobs import GenerateJob, Job, ScoreJob
from ssr_server.engine.torch.lane import wanted
from ssr_server.engine.torch.loader import LoadedModel
from ssr_server.engine.torch.runner import Chunk

TOL = 1e-4


class LaneTap:
    """Records which thread ran each forward; with ``wait``, each lane forward waits until the
    scheduler's thread has run one of its own after it began (so a test sees the two overlap, whatever
    the machine's speed)."""

    def __init__(self, engine: TorchEngine, poison: list[int] | None = None, wait: bool = False) -> None:
        self.main: list[list[Chunk]] = []
        self.lane: list[list[Chunk]] = []
        self.overlapped: list[bool] = []
        self._main_ran = threading.Event()
        inner = engine.runner.forward

        def forward(chunks: list[Chunk]) -> Any:
            if threading.current_thread().name.startswith("ssr-torch-lane"):
                self.lane.append(list(chunks))
                if wait:
                    self._main_ran.clear()
                    self.overlapped.append(self._main_ran.wait(timeout=20))
                if poison is not None and any(c.ids == poison for c in chunks):
                    raise RuntimeError("poisoned chunk in this forward")
            else:
                self.main.append(list(chunks))
                self._main_ran.set()
            return inner(chunks)

        engine.runner.forward = forward  # type: ignore[method-assign]


def _submit(engine: TorchEngine, *jobs: Job) -> None:
    for j in jobs:
        engine.scheduler.submit(j)


def _long(tok: Any, n: int) -> Context:
    text = " ".join(f"item {i} is a tower of iron." for i in range(n))
    return Context(tuple(tok.encode(text, add_special_tokens=False)[:n]))


def _max_diff(a: list[CandidateScore], b: list[CandidateScore]) -> float:
    return max(abs(x - y) for sa, sb in zip(a, b, strict=True)
               for x, y in zip(sa.token_logprobs, sb.token_logprobs, strict=True))


def test_auto_turns_the_lane_on_with_one_intra_op_thread_only() -> None:
    assert wanted("on", None) and wanted("on", 4) and not wanted("off", 1)
    assert not wanted("auto", None) and not wanted("auto", 2)
    with pytest.raises(EngineError, match="prefill_lane"):
        EngineConfig(prefill_lane="sometimes")


def test_decode_steps_go_on_while_the_lane_runs_heavy_work(
        make_engine: Callable[..., TorchEngine], runner: Any, tok: Any, contexts: dict[str, Context],
        candidates: list[list[int]]) -> None:
    engine = make_engine(prefill_lane="on")
    _submit(engine, ScoreJob(contexts["text"], candidates=candidates[:1]))
    engine.scheduler.run_until_idle()
    params = GenerationParams(max_new_tokens=200, ignore_eos=True)  # decoding all along
    # an action prompt on a cached context: light, so it runs on the scheduler's thread
    action = Context(contexts["text"].token_ids + tuple(tok.encode(" so", add_special_tokens=False)))
    gen = GenerateJob(action, params=params)
    _submit(engine, gen)
    engine.scheduler.step()
    engine.scheduler.step()  # decoding
    assert engine.scheduler._running
    tap = LaneTap(engine, wait=True)
    heavy = ScoreJob(_long(tok, 200), candidates=candidates)
    selection = ScoreJob(contexts["text"], candidates=candidates)
    _submit(engine, heavy, selection)
    engine.scheduler.run_until_idle()
    # the heavy work ran on the lane, while the scheduler's thread ran decode steps
    assert tap.lane and all(tap.overlapped)
    assert not any(len(c.ids) > 100 for f in tap.main for c in f)
    assert any(c.ids == candidates[0] for f in tap.lane for c in f)
    # the same results as without a lane
    got = heavy.future.result()
    assert isinstance(got, list) and _max_diff(got, runner.naive_score(_long(tok, 200), candidates)) <= TOL
    sel = selection.future.result()
    assert isinstance(sel, list) and _max_diff(sel, runner.naive_score(contexts["text"], candidates)) <= TOL
    alone = make_engine(prefill_lane="off")
    solo = GenerateJob(action, params=params)
    _submit(alone, solo)
    alone.scheduler.run_until_idle()
    out = gen.future.result()
    assert isinstance(out, Generation) and out.token_ids == solo.future.result().token_ids  # type: ignore[union-attr]


def test_a_failing_lane_forward_fails_its_own_job_alone(make_engine: Callable[..., TorchEngine],
                                                        runner: Any, contexts: dict[str, Context],
                                                        candidates: list[list[int]]) -> None:
    engine = make_engine(prefill_lane="on")
    poison = [5, 6, 7, 8, 9]
    _submit(engine, *(ScoreJob(contexts[w], candidates=candidates[:1]) for w in ("text", "image")))
    engine.scheduler.run_until_idle()
    LaneTap(engine, poison=poison)
    gen = GenerateJob(contexts["two_images"], params=GenerationParams(max_new_tokens=8, ignore_eos=True))
    _submit(engine, gen)
    engine.scheduler.step()
    bad = ScoreJob(contexts["text"], candidates=[candidates[1], poison])
    good = ScoreJob(contexts["image"], candidates=candidates)
    _submit(engine, bad, good)
    engine.scheduler.run_until_idle()
    with pytest.raises(EngineError, match="poisoned"):
        bad.future.result()
    got = good.future.result()
    assert isinstance(got, list) and _max_diff(got, runner.naive_score(contexts["image"], candidates)) <= TOL
    out = gen.future.result()
    assert isinstance(out, Generation) and len(out.token_ids) == 8


def test_closing_with_a_batch_on_the_lane_leaves_no_job_waiting(make_engine: Callable[..., TorchEngine],
                                                                tok: Any, contexts: dict[str, Context],
                                                                candidates: list[list[int]]) -> None:
    engine = make_engine(prefill_lane="on")
    LaneTap(engine)
    gen = GenerateJob(contexts["text"], params=GenerationParams(max_new_tokens=40, ignore_eos=True))
    _submit(engine, gen)
    engine.scheduler.step()
    heavy = ScoreJob(_long(tok, 200), candidates=candidates)
    _submit(engine, heavy)
    engine.scheduler.step()  # the heavy job goes to the lane
    engine.scheduler.close()
    for job in (gen, heavy):
        assert job.future.done()
        with pytest.raises(EngineError, match="closed"):
            job.future.result()


def test_a_threaded_engine_with_a_lane_gives_the_same_results(lm: LoadedModel, tok: Any,
                                                              contexts: dict[str, Context],
                                                              candidates: list[list[int]]) -> None:
    """Concurrent selections and tool calls through the engine's own worker thread, lane on and off."""
    schema = json.dumps({"type": "object", "additionalProperties": False, "required": ["q"],
                         "properties": {"q": {"type": "string", "maxLength": 12}}})
    params = GenerationParams(max_new_tokens=24, grammar=Grammar("json_schema", schema))

    async def run(engine: TorchEngine) -> list[Any]:
        try:
            jobs = [engine.score(contexts[w], candidates) for w in ("text", "image", "two_images")]
            jobs += [engine.generate(Context(contexts[w].token_ids + tuple(tok.encode(f" call {i}:")),
                                             contexts[w].images), params)
                     for i, w in enumerate(("text", "image", "text"))]
            return list(await asyncio.gather(*jobs))
        finally:
            await engine.close()

    on = asyncio.run(run(TorchEngine(lm, EngineConfig(prefill_lane="on"))))
    off = asyncio.run(run(TorchEngine(lm, EngineConfig(prefill_lane="off"))))
    for a, b in zip(on, off, strict=True):
        if isinstance(a, Generation):
            assert isinstance(b, Generation) and (a.token_ids, a.text) == (b.token_ids, b.text)
        else:
            assert _max_diff(a, b) <= TOL

"""Every tensor the engine makes names its device: run under a meta default device, any tensor made
without one lands on ``meta`` and the first operation mixing it with the model's (CPU) tensors, or
reading it back, fails. The work runs on the test thread (``start=False``), inside the device context."""

from __future__ import annotations

import json

import torch

from ssr_server.core.protocol import CandidateScore, Context, Generation, GenerationParams, Grammar
from ssr_server.engine.torch.engine import TorchEngine
from ssr_server.engine.torch.jobs import GenerateJob, Job, ScoreJob
from ssr_server.engine.torch.loader import LoadedModel

SCHEMA = json.dumps({"type": "object", "properties": {"q": {"type": "string", "pattern": "^[a-z ]{1,12}$"}},
                     "required": ["q"], "additionalProperties": False})


def jobs(engine: TorchEngine, contexts: dict[str, Context], candidates: list[list[int]]) -> list[Job]:
    grammar = engine.grammars.state(engine.grammars.compile(Grammar("json_schema", SCHEMA)))
    return [
        ScoreJob(contexts["two_images"], candidates=candidates),
        ScoreJob(contexts["text"], candidates=candidates[:2]),
        GenerateJob(contexts["image"], params=GenerationParams(max_new_tokens=6)),
        GenerateJob(contexts["text"], params=GenerationParams(max_new_tokens=6, temperature=0.8, seed=5,
                                                              top_k=50, top_p=0.9)),
        GenerateJob(contexts["text"], params=GenerationParams(max_new_tokens=40, grammar=Grammar(
            "json_schema", SCHEMA)), grammar=grammar),
    ]


def run(engine: TorchEngine, work: list[Job]) -> list[object]:
    for j in work:
        engine.scheduler.submit(j)
    engine.scheduler.run_until_idle()
    return [j.future.result() for j in work]


def test_the_engine_makes_no_tensor_without_a_device(lm: LoadedModel, contexts: dict[str, Context],
                                                     candidates: list[list[int]]) -> None:
    on_meta = TorchEngine(lm, start=False)
    reference = TorchEngine(lm, start=False)
    try:
        with torch.device("meta"):
            got = run(on_meta, jobs(on_meta, contexts, candidates))
            # turn 2: a cached prefix, the chosen candidate's KV, chunked prefill of the rest
            chosen = contexts["text"].extend(candidates[0] + candidates[1])
            again = run(on_meta, [ScoreJob(chosen, candidates=candidates[2:]),
                                  GenerateJob(chosen, params=GenerationParams(max_new_tokens=3))])
        want = run(reference, jobs(reference, contexts, candidates))
    finally:
        on_meta.scheduler.close()
        reference.scheduler.close()
    for a, b in zip(got, want, strict=True):
        if isinstance(a, Generation):
            assert isinstance(b, Generation) and a.token_ids == b.token_ids
        else:
            assert isinstance(a, list) and isinstance(b, list)
            assert all(isinstance(x, CandidateScore) for x in a)
            assert [x.token_logprobs for x in a] == [y.token_logprobs for y in b]
    assert isinstance(again[1], Generation) and len(again[1].token_ids) == 3
    assert isinstance(got[4], Generation)
    json.loads(got[4].text)


def test_the_meta_device_catches_a_tensor_without_a_device() -> None:
    """The trick itself: a tensor made without a device meets real data and fails loudly."""
    import pytest

    real = torch.ones(3)
    with torch.device("meta"), pytest.raises((RuntimeError, NotImplementedError)):
        float((torch.arange(3) + real).sum())

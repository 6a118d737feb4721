"""The mixed-load case of ``bench serve`` (engine level): it measures the decoding run's inter-token gaps
alone and during another run's long prefill; figures are printed, never asserted (no wall-clock tests)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from ssr_server.bench.mixed import format_mixed, forward_tap, long_context, run_mixed_bench
from ssr_server.bench.serve import format_table
from ssr_server.engine.torch.engine import TorchEngine


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[TorchEngine]:
    eng = TorchEngine(str(tiny_model_dir))
    yield eng
    asyncio.run(eng.close())


def test_long_context_is_long_and_unique(engine: TorchEngine) -> None:
    a, b = long_context(engine.tokenizer, 300, 1), long_context(engine.tokenizer, 300, 2)
    assert len(a) >= 300 and len(b) >= 300 and a != b


def test_mixed_bench_measures_both_variants(engine: TorchEngine) -> None:
    r = run_mixed_bench(engine, long_tokens=400, decode_tokens=24, start_after=4, repeats=1)
    assert r["long_context_tokens"] >= 400 and r["decode_tokens"] == 24
    assert len(r["samples_ms"]["undisturbed"]) == 23  # 24 tokens, 23 gaps
    assert r["mixed_gaps"] >= 1 and r["mixed_gaps"] == len(r["samples_ms"]["mixed"])
    assert all(x > 0 for x in r["samples_ms"]["mixed"])
    text = format_mixed(r)
    assert "p95 ratio" in text and "during the long prefill" in text
    assert format_table({"mixed": r, "levels": []}) == text
    assert engine.runner.forward.__func__ is type(engine.runner).forward  # type: ignore[attr-defined]


def test_forward_tap_finds_the_decoding_run(engine: TorchEngine) -> None:
    from ssr_server.core.protocol import Context, GenerationParams

    ctx = Context(tuple(engine.tokenizer.encode("Describe the tower.", add_special_tokens=False)))

    async def go() -> list[float]:
        with forward_tap(engine) as tap:
            await asyncio.gather(engine.generate(ctx, GenerationParams(max_new_tokens=6, ignore_eos=True)),
                                 engine.score(ctx, [[5, 6, 7]]))
            return tap.token_times()

    times = asyncio.run(go())
    assert len(times) == 5 and times == sorted(times)  # 6 tokens: 5 forwards fed the decoding run

"""Correctness of the embedded engine where it runs (the GPU, or the CPU in a rehearsal).

- packed scores vs naive: the engine's score of the default candidates on the last measured context
  (cached, multimodal) against ``ModelRunner.naive_score`` (one plain transformers forward per
  candidate); the largest per-token log-probability difference, within ``1e-3`` in bf16 (``1e-4``
  in fp32).
- greedy generation vs transformers' ``generate``: the engine's greedy tokens on that context against
  ``model.generate(do_sample=False)`` on the same expanded ids and pixels, up to the first
  end-of-sequence token; equal, or where they part.
"""

from __future__ import annotations

import asyncio
from typing import Any

GREEDY_TOKENS = 32
TOLERANCE = {"bfloat16": 1e-3, "float16": 1e-3, "float32": 1e-4}


def hf_greedy(lm: Any, ctx: Any, n: int) -> list[int]:
    """transformers' own greedy ``generate`` on the context as the engine expands it."""
    import torch

    from ssr_server.engine.torch.multimodal import ImageCache, expand, images_in

    exp = expand(lm, ctx, ImageCache())
    ids = torch.tensor([exp.ids], dtype=torch.long, device=lm.device)
    kwargs: dict[str, Any] = {"attention_mask": torch.ones_like(ids)}
    pv, grid = images_in(exp, 0, len(exp.ids))
    if pv is not None:
        kwargs.update(pixel_values=pv, image_grid_thw=grid)
        kwargs["mm_token_type_ids"] = torch.eq(ids, lm.image_token_id).int()
    eos = sorted(lm.eos_token_ids)
    with torch.inference_mode():
        try:
            out = lm.model.generate(input_ids=ids, max_new_tokens=n, do_sample=False, eos_token_id=eos,
                                    pad_token_id=eos[0], **kwargs)
        except (TypeError, ValueError):  # a transformers without mm_token_type_ids in generate
            kwargs.pop("mm_token_type_ids", None)
            out = lm.model.generate(input_ids=ids, max_new_tokens=n, do_sample=False, eos_token_id=eos,
                                    pad_token_id=eos[0], **kwargs)
    tokens = [int(t) for t in out[0, len(exp.ids) :].tolist()]
    for i, t in enumerate(tokens):  # up to and with the first end token, as the engine returns it
        if t in lm.eos_token_ids:
            return tokens[: i + 1]
    return tokens


async def run_checks(engine: Any, ctx: Any, candidates: list[list[int]], dtype: str,
                     greedy_tokens: int = GREEDY_TOKENS) -> dict[str, Any]:
    """Both checks on ``engine`` (a ``TorchEngine``, idle) and ``ctx``."""
    from ssr_server.core.protocol import GenerationParams

    got = await engine.score(ctx, candidates)  # cached by the measurement: the packed pass alone
    want = await asyncio.to_thread(engine.runner.naive_score, ctx, candidates)
    diff = max(abs(a - b) for s, t in zip(got, want, strict=True)
               for a, b in zip(s.token_logprobs, t.token_logprobs, strict=True))
    tol = TOLERANCE.get(dtype, 1e-3)
    ours = list((await engine.generate(ctx, GenerationParams(max_new_tokens=greedy_tokens))).token_ids)
    ref = await asyncio.to_thread(hf_greedy, engine.lm, ctx, greedy_tokens)
    pairs = enumerate(zip(ours, ref, strict=False))
    same = next((i for i, (a, b) in pairs if a != b), min(len(ours), len(ref)))
    return {
        "packed_vs_naive_max_abs_diff": diff, "packed_vs_naive_tolerance": tol,
        "packed_vs_naive_ok": diff <= tol,
        "greedy_tokens": len(ours), "greedy_equal": ours == ref, "greedy_common_prefix": same,
        "greedy_engine": ours, "greedy_transformers": ref,
    }

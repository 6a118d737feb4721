"""Scoring benchmark: naive vs packed vs packed-on-cache scoring vs freeform decoding, side by side.

One run measures, on the same ~700-token agent context (system prompt, question, a chosen rationale,
an action and a demo-like observation; with an image for vision-language models) and the six
candidate rationales of the default library:

- ``naive_ms``: ``ModelRunner.naive_score``, one plain transformers forward over context + candidate
  per candidate (the reference);
- ``packed_ms``: an empty prefix cache, then prefill + ONE packed forward of all candidates;
- ``packed_cached_ms``: the packed forward alone, on a context already in the prefix cache (turn t+1
  of an agent run);
- ``freeform_ms``: greedy decoding of exactly ``freeform_tokens`` (128) tokens from the cached context,
  no stop strings, EOS ignored (driven through the runner exactly as the scheduler decodes);

as medians over ``repeats`` (interleaved, so machine noise hits every method alike), plus the largest
per-token log-probability difference between packed and naive and the two ratios the issue floors:
``packed/naive <= 0.25`` and ``packed_cached/freeform <= 0.10`` (0.6B shape, bf16), and
``max_abs_diff <= 1e-4`` in fp32.

``shape='0.6b'`` builds a random Qwen3ForCausalLM of Qwen3-0.6B's shape in memory (no download) with
the real Qwen tokenizer; otherwise ``model`` is a model directory (default: the tiny VL model, built
into a temporary directory).
"""

from __future__ import annotations

import dataclasses
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
from PIL import Image, ImageDraw

from ssr_server.bench.report import write_json
from ssr_server.core.errors import EngineError
from ssr_server.core.protocol import Context, ImageRef
from ssr_server.engine.torch import segments
from ssr_server.engine.torch.config import EngineConfig
from ssr_server.engine.torch.loader import LoadedModel, configure_bf16_matmul, load_model, resolve_dtype
from ssr_server.engine.torch.multimodal import ImageCache, expand
from ssr_server.engine.torch.prefix_cache import CacheEntry, PrefixCache
from ssr_server.engine.torch.runner import Chunk, ModelRunner

T = TypeVar("T")

FREEFORM_TOKENS = 128
CONTEXT_TOKENS = 700
CACHE_BYTES = 8 << 30

FLOOR_MAX_ABS_DIFF_FP32 = 1e-4
FLOOR_PACKED_OVER_NAIVE = 0.25  # 0.6B shape, bf16
FLOOR_CACHED_OVER_FREEFORM = 0.10  # 0.6B shape, bf16

QWEN3_0P6B: dict[str, Any] = {
    "hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 128, "intermediate_size": 3072, "vocab_size": 151936, "tie_word_embeddings": True,
    "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
}

QUESTION = "What is the name of this landmark, and in which year was it completed?"
RESULTS = (
    "Eiffel Tower - Wikipedia. The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in "
    "Paris, France. It is named after the engineer Gustave Eiffel, whose company designed and built it.",
    "Eiffel Tower | History, Height, & Facts | Britannica. Built for the 1889 World's Fair, the tower was "
    "the tallest structure in the world until 1930 and is 330 metres tall with its antennas.",
    "Visit the Eiffel Tower - official site. Opening hours, tickets and access. The tower welcomes about "
    "seven million visitors a year; lifts serve the second floor and the summit.",
    "Construction of the Eiffel Tower. Work on the foundations began in January 1887 and the tower was "
    "completed on 31 March 1889, in two years, two months and five days.",
    "Paris landmarks: a travel guide. From the Louvre to Notre-Dame and the Arc de Triomphe, the city's "
    "monuments draw visitors all year; the iron tower is the most recognisable of them.",
    "Gustave Eiffel (1832-1923), French civil engineer. His firm also built the internal frame of the "
    "Statue of Liberty and many railway bridges and viaducts across Europe.",
    "Image result: a tall iron lattice tower against a blue sky, seen from the Trocadero gardens across "
    "the river Seine; similar images show the same tower at night with lights.",
    "Wrought iron: properties and uses. A tough, malleable iron alloy with very little carbon, used in "
    "nineteenth-century bridges, towers, railings and ships before steel replaced it.",
)


# ---------------------------------------------------------------- models


def _threads(threads: int | None) -> int:
    n = threads or len(os.sched_getaffinity(0)) or os.cpu_count() or 1
    torch.set_num_threads(n)
    return n


def build_random_qwen3(dtype: str = "bf16", shape: str = "0.6b", seed: int = 0,
                       bf16_matmul: str = "auto") -> LoadedModel:
    """A random Qwen3ForCausalLM of the given shape in memory, with the real Qwen tokenizer (no hub)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from ssr_server.engine.tiny import build_tokenizer

    if shape.lower() not in ("0.6b", "0p6b", "qwen3-0.6b"):
        raise EngineError(f"unknown shape {shape!r}; known: 0.6b")
    torch_dtype = resolve_dtype(dtype)
    config = Qwen3Config(**QWEN3_0P6B)
    config._attn_implementation = segments.register()  # what load_model asks for
    # Construct on the meta device in the target dtype, then allocate once and fill with N(0, 0.02):
    # transformers' default init (fp32, then a cast) takes several times longer for 0.6B parameters.
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch_dtype)
    try:
        with torch.device("meta"):
            model = Qwen3ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model = model.to_empty(device="cpu")
    model.tie_weights()
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)  # its buffers were on meta
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02, generator=gen)
            else:
                p.fill_(1.0)  # RMSNorm weights
    model.eval()
    configure_bf16_matmul(model, torch_dtype, torch.device("cpu"), bf16_matmul)
    tok: Any = build_tokenizer("qwen")
    eos = frozenset(int(tok.convert_tokens_to_ids(t)) for t in ("<|im_end|>", "<|endoftext|>"))
    return LoadedModel(model=model, tokenizer=tok, image_processor=None, is_vl=False, dtype=torch_dtype,
                       device=torch.device("cpu"), image_token_id=None, merge_size=1, eos_token_ids=eos,
                       name=f"random Qwen3 {shape} shape (in memory)")


def _config(dtype: str, bf16_matmul: str) -> EngineConfig:
    if bf16_matmul not in ("auto", "native", "fp32"):
        raise EngineError(f"bf16_matmul must be auto, native or fp32, not {bf16_matmul!r}")
    return EngineConfig(dtype=dtype, bf16_matmul=bf16_matmul)  # type: ignore[arg-type]


def _load(model: str | None, shape: str | None, dtype: str, bf16_matmul: str = "auto") -> LoadedModel:
    if shape:
        return build_random_qwen3(dtype, shape, bf16_matmul=bf16_matmul)
    if model:
        return load_model(model, _config(dtype, bf16_matmul))
    from ssr_server.engine.tiny import build_tiny_model

    tmp = Path(tempfile.mkdtemp(prefix="ssr-bench-tiny-"))
    try:
        build_tiny_model(tmp / "model", seed=0)
        lm = load_model(str(tmp / "model"), _config(dtype, bf16_matmul))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dataclasses.replace(lm, name="tiny Qwen3-VL (seed 0, built offline)")


# ---------------------------------------------------------------- the workload


def _bench_image() -> ImageRef:
    img = Image.new("RGB", (224, 160), (135, 180, 230))
    draw = ImageDraw.Draw(img)
    draw.polygon([(112, 10), (80, 150), (144, 150)], fill=(90, 70, 50))
    draw.rectangle((0, 140, 223, 159), fill=(60, 130, 60))
    return ImageRef.from_pil(img)


def bench_context(lm: LoadedModel, candidates: Sequence[Sequence[int]],
                  target_tokens: int = CONTEXT_TOKENS) -> Context:
    """Turn 2 of an agent run: prompt (+ image), chosen rationale, action, observation; ~target tokens."""
    from ssr_server.agent.chat import ChatRenderer
    from ssr_server.core.formats.format import get_format
    from ssr_server.core.library import LibraryRegistry

    fmt = get_format()
    chat = ChatRenderer(lm.tokenizer, fmt)
    images = (_bench_image(),) if lm.is_vl else ()
    action = chat.encode(fmt.tool_call_text("image_search", {}))
    head = chat.start(QUESTION, images, LibraryRegistry().get("default"))
    head = head.extend(list(candidates[0]) + list(action))
    cache = ImageCache()
    ctx = head
    for n in range(1, 64):
        lines = [f"{i + 1}. {RESULTS[i % len(RESULTS)]}" for i in range(n)]
        ctx = head.extend(chat.observation("Search results:\n" + "\n".join(lines), (), len(images)))
        if len(expand(lm, ctx, cache).ids) >= target_tokens:
            break
    return ctx


def default_candidates(lm: LoadedModel) -> list[list[int]]:
    from ssr_server.core.formats.format import get_format
    from ssr_server.core.library import LibraryRegistry

    library = LibraryRegistry().get("default")
    surfaces = get_format().candidate_surfaces(library)
    return [list(c) for c in library.candidate_token_ids(lm.tokenizer, surfaces)]


# ---------------------------------------------------------------- measurements


def _timed(fn: Callable[[], T]) -> tuple[float, T]:
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1e3, out


def _packed_cold(lm: LoadedModel, ctx: Context, cands: list[list[int]]) -> tuple[float, float, list[Any]]:
    """Empty prefix cache: prefill, then the packed forward. Returns (prefill_ms, score_ms, scores)."""
    runner = ModelRunner(lm, PrefixCache(CACHE_BYTES))
    t0 = time.perf_counter()
    p = runner.prepare(ctx, reserve=sum(len(c) for c in cands))  # as the engine prepares a score job
    runner.prefill([p])
    t1 = time.perf_counter()
    assert p.entry is not None  # internal invariant: prefill inserts the entry
    scores = runner.score([(p.entry, cands)])[0]
    t2 = time.perf_counter()
    return (t1 - t0) * 1e3, (t2 - t1) * 1e3, scores


def _packed_cached(runner: ModelRunner, ctx: Context, cands: list[list[int]]) -> list[Any]:
    p = runner.prepare(ctx)
    if p.entry is None:
        raise EngineError("benchmark context fell out of the prefix cache")
    return runner.score([(p.entry, cands)])[0]


def greedy_decode(runner: ModelRunner, entry: CacheEntry, n: int) -> list[int]:
    """Exactly ``n`` greedy tokens from a cached context, EOS ignored, as the scheduler decodes them
    (fork the entry's KV, then one single-token forward per token but the last)."""
    kv = entry.kv.fork(extra=n + 16)
    logits, pos = entry.last_logits, entry.next_pos
    dims = 3 if runner.lm.is_vl else 1
    out: list[int] = []
    for i in range(n):
        tok = int(torch.argmax(logits))
        out.append(tok)
        if i == n - 1:
            break
        pos_t = torch.full((dims, 1), pos, dtype=torch.long, device=runner.device)
        res = runner.forward([Chunk(kv, [tok], pos_t, [0], past_len=kv.length)])[0]
        if res.inplace:
            kv.length += 1
        else:
            kv.append(res.keys, res.values)
        pos += 1
        logits = res.logits[0]
    return out


def _max_abs_diff(a: Sequence[Any], b: Sequence[Any]) -> float:
    return max((abs(x - y) for s, t in zip(a, b, strict=True)
                for x, y in zip(s.token_logprobs, t.token_logprobs, strict=True)), default=0.0)


def _profile(runner: ModelRunner, ctx: Context, cands: list[list[int]], decode_steps: int = 8) -> str:
    """Top operators of one cached packed score and of ``decode_steps`` decode steps."""
    from torch.profiler import ProfilerActivity, profile

    p = runner.prepare(ctx)
    assert p.entry is not None
    parts = []
    for label, fn in (("packed score on cached context", lambda: _packed_cached(runner, ctx, cands)),
                      (f"{decode_steps} decode steps", lambda: greedy_decode(runner, p.entry,  # type: ignore[arg-type]
                                                                              decode_steps + 1))):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14)
        parts.append(f"--- {label}\n{table}")
    return "\n".join(parts)


def _cpu_info() -> dict[str, Any]:
    model, flags = platform.processor() or "", set[str]()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return {"model": model, "cores": len(os.sched_getaffinity(0)),
            "native_bf16": bool(flags & {"avx512_bf16", "amx_bf16"}),
            "loadavg_1m": round(os.getloadavg()[0], 2)}


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def run_scoring_bench(model: str | None, shape: str | None, dtype: str, repeats: int,
                      json_path: str | None, engine: str = "torch", *, sglang_url: str | None = None,
                      threads: int | None = None, profile: bool = False,
                      freeform_tokens: int = FREEFORM_TOKENS, context_tokens: int = CONTEXT_TOKENS,
                      bf16_matmul: str = "auto") -> dict[str, Any]:
    """Measure naive / packed / packed-on-cache scoring and freeform decoding; see the module docstring."""
    if engine != "torch":
        raise NotImplementedError(f"the scoring bench for engine {engine!r} is not implemented yet "
                                  f"(sglang_url={sglang_url!r})")
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    n_threads = _threads(threads)
    t_load, lm = _timed(lambda: _load(model, shape, dtype, bf16_matmul))
    cands = default_candidates(lm)
    ctx = bench_context(lm, cands, context_tokens)
    n_ctx = len(expand(lm, ctx, ImageCache()).ids)

    # Warm-up (untimed): one prefill + packed score, which also leaves the context cached.
    warm = ModelRunner(lm, PrefixCache(CACHE_BYTES))
    warm.score_context(ctx, cands)

    naive_ms, packed_ms, prefill_ms, score_ms, cached_ms, free_ms = [], [], [], [], [], []
    diff = 0.0
    free_tokens: list[int] = []
    for _ in range(repeats):
        ms, naive = _timed(lambda: ModelRunner(lm, PrefixCache(CACHE_BYTES)).naive_score(ctx, cands))
        naive_ms.append(ms)
        pre, sc, packed = _packed_cold(lm, ctx, cands)
        prefill_ms.append(pre)
        score_ms.append(sc)
        packed_ms.append(pre + sc)
        diff = max(diff, _max_abs_diff(packed, naive))
        ms, cached = _timed(lambda: _packed_cached(warm, ctx, cands))
        cached_ms.append(ms)
        diff = max(diff, _max_abs_diff(cached, naive))
        entry = warm.prepare(ctx).entry
        assert entry is not None
        ms, free_tokens = _timed(lambda: greedy_decode(warm, entry, freeform_tokens))  # noqa: B023
        free_ms.append(ms)

    result: dict[str, Any] = {
        "engine": engine, "bf16_matmul": bf16_matmul if lm.dtype == torch.bfloat16 else None,
        "bf16_fp32_kernel": bool(getattr(lm.model, "ssr_fp32_matmul_layers", 0)),
        "model": lm.name, "shape": shape, "dtype": str(lm.dtype).replace("torch.", ""),
        "is_vl": lm.is_vl, "threads": n_threads, "repeats": repeats, "load_s": round(t_load / 1e3, 2),
        "params_m": round(sum(p.numel() for p in lm.model.parameters()) / 1e6, 1),
        "context_tokens": n_ctx, "context_images": len(ctx.images),
        "candidate_tokens": [len(c) for c in cands],
        "naive_ms": _median(naive_ms), "packed_ms": _median(packed_ms),
        "packed_prefill_ms": _median(prefill_ms), "packed_score_ms": _median(score_ms),
        "packed_cached_ms": _median(cached_ms), "freeform_ms": _median(free_ms),
        "freeform_tokens": len(free_tokens),
        "decode_ms_per_token": _median(free_ms) / max(1, len(free_tokens)),
        "max_abs_diff": diff,
        "runs_ms": {"naive": naive_ms, "packed": packed_ms, "packed_cached": cached_ms, "freeform": free_ms},
        "cpu": _cpu_info(),
        "versions": {"torch": torch.__version__, "transformers": _transformers_version()},
    }
    result["packed_over_naive"] = result["packed_ms"] / result["naive_ms"]
    result["packed_cached_over_freeform"] = result["packed_cached_ms"] / result["freeform_ms"]
    is_06b_bf16 = bool(shape) and lm.dtype == torch.bfloat16
    result["floors"] = [
        {"name": "max_abs_diff (fp32)", "value": diff, "limit": FLOOR_MAX_ABS_DIFF_FP32,
         "applies": lm.dtype == torch.float32, "ok": diff <= FLOOR_MAX_ABS_DIFF_FP32},
        {"name": "packed/naive (0.6B bf16)", "value": result["packed_over_naive"],
         "limit": FLOOR_PACKED_OVER_NAIVE, "applies": is_06b_bf16,
         "ok": result["packed_over_naive"] <= FLOOR_PACKED_OVER_NAIVE},
        {"name": "packed_cached/freeform (0.6B bf16)", "value": result["packed_cached_over_freeform"],
         "limit": FLOOR_CACHED_OVER_FREEFORM, "applies": is_06b_bf16,
         "ok": result["packed_cached_over_freeform"] <= FLOOR_CACHED_OVER_FREEFORM},
    ]
    if profile:
        result["profile"] = _profile(warm, ctx, cands)
    if json_path:
        write_json(json_path, result)
    return result


def _transformers_version() -> str:
    import transformers

    return str(transformers.__version__)


def format_table(result: dict[str, Any]) -> str:
    """A plain-text table of one run's figures."""
    r = result
    cpu = r.get("cpu", {})
    lines = [
        f"scoring bench - {r['model']} ({r['params_m']}M params), {r['dtype']}, engine {r['engine']}, "
        f"{r['threads']} torch threads, median of {r['repeats']}",
        f"cpu: {cpu.get('model', '?')} ({cpu.get('cores', '?')} cores, native bf16: "
        f"{cpu.get('native_bf16', '?')}, load {cpu.get('loadavg_1m', '?')})"
        + (", bf16 matmuls of >= 8 rows via the fp32 kernel" if r.get("bf16_fp32_kernel") else ""),
        f"context: {r['context_tokens']} tokens ({r['context_images']} images); candidates: "
        f"{len(r['candidate_tokens'])} of {r['candidate_tokens']} tokens",
        "",
        f"{'method':<34}{'ms':>12}",
        f"{'naive (one forward per candidate)':<34}{r['naive_ms']:>12.1f}",
        f"{'packed (prefill + packed score)':<34}{r['packed_ms']:>12.1f}",
        f"{'  of which prefill':<34}{r['packed_prefill_ms']:>12.1f}",
        f"{'  of which packed score':<34}{r['packed_score_ms']:>12.1f}",
        f"{'packed on cached context':<34}{r['packed_cached_ms']:>12.1f}",
        f"{'freeform greedy, ' + str(r['freeform_tokens']) + ' tokens':<34}{r['freeform_ms']:>12.1f}",
        f"{'  per decoded token':<34}{r['decode_ms_per_token']:>12.2f}",
        "",
        f"packed/naive = {r['packed_over_naive']:.3f}   packed_cached/freeform = "
        f"{r['packed_cached_over_freeform']:.3f}   max |packed - naive| = {r['max_abs_diff']:.2e}",
    ]
    for f in r.get("floors", []):
        if f["applies"]:
            lines.append(f"floor {f['name']}: {f['value']:.4g} <= {f['limit']:g}  "
                         f"{'PASS' if f['ok'] else 'FAIL'}")
    if "profile" in r:
        lines += ["", r["profile"]]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--model", default=None, help="model dir (default: the tiny VL model)")
    ap.add_argument("--shape", default=None, help="0.6b: a random Qwen3 of 0.6B shape in memory")
    ap.add_argument("--dtype", default="fp32", help="fp32 | bf16")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--engine", default="torch")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    ap.add_argument("--profile", action="store_true", help="also profile a cached score and decode")
    ap.add_argument("--json", dest="json_path", default=None)
    a = ap.parse_args(argv)
    result = run_scoring_bench(a.model, a.shape, a.dtype, a.repeats, a.json_path, a.engine,
                               threads=a.threads, profile=a.profile)
    print(format_table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

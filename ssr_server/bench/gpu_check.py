"""GPU check: per-turn reasoning latency of SSR vs freeform on random Qwen3-VL-2B/4B-shaped models.

For a machine with an NVIDIA GPU and no model hub. For each shape it

1. builds a random-weight Qwen3VLForConditionalGeneration of the public config's shape (embedded below,
   no download) on the GPU, and saves it as safetensors with the real Qwen vocabulary
   (``tiny.build_tokenizer("qwen")``), the config in the public ``config.json`` form and a Qwen3-VL
   image-processor config;
2. serves it: ``engine="sglang"`` starts ``python -m ssr_server.engine.sglang.server`` (SGLang's server
   plus our ``/ssr/score`` route; SGLang's GPU install must be present, e.g. the lmsysorg/sglang
   image) and waits for ``/health``; ``engine="torch"`` loads it in the embedded ``TorchEngine``;
3. measures ``turns`` agent turns after ``warmup`` untimed ones. The context is the agent's
   (``PromptBuilder.start``: system prompt, a demo-world image, the question) and grows each turn like
   a real run's (the selected rationale, a text-search action, its results as an observation).
   Per turn, SSR reasoning is ONE ``engine.score`` of the default library's six candidates plus the
   selection; freeform reasoning is ``engine.generate`` of exactly 128 tokens (greedy, EOS ignored).
   The two methods run on two contexts of identical length that differ only in their image, so neither
   finds the other's KV cache and each pays the prefill of its turn's new tokens, as in a real run;
   their order alternates by turn.

It reports per shape the mean and p95 of both, the reduction, the decode cost per token (freeform
mean / 128), the scoring cost in decode steps (SSR mean / decode ms per token) and a prefix-cache check
(from turn 1 on, each call must find at least 95% of the previous turn's context cached), prints a
table and writes JSON (after each shape, so a later failure keeps the earlier figures).

Without CUDA it refuses (exit code 2) unless ``dry_run``, which only builds the configs, counts the
parameters (on the meta device: no memory) and prints the plan. Without SGLang (``engine="sglang"``) it
exits with code 3.

    python -m ssr_server.bench.gpu_check --shape 2b --shape 4b --engine sglang --turns 20 --json out.json
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FREEFORM_TOKENS = 128
DEFAULT_TURNS = 20
DEFAULT_WARMUP = 2
HEALTH_TIMEOUT_S = 900.0  # the first start captures CUDA graphs and may compile kernels
MEM_FRACTION_STATIC = 0.8
IMAGE_SIZE = (448, 320)  # 14 x 10 merged patches: 140 image tokens
CACHE_REUSE_FLOOR = 0.95
TORCH_CACHE_BYTES = 16 << 30
MAX_SHARD_BYTES = 4 << 30

EXIT_NO_GPU = 2
EXIT_NO_SGLANG = 3
EXIT_FAILED = 1

# The real Qwen2/Qwen3 special-token ids (tiny.build_tokenizer("qwen") reproduces them; checked at build).
BOS_ID = 151643  # <|endoftext|>
EOS_ID = 151645  # <|im_end|>
VISION_START_ID = 151652
VISION_END_ID = 151653
IMAGE_TOKEN_ID = 151655
VIDEO_TOKEN_ID = 151656
_EXPECTED_IDS = {"<|endoftext|>": BOS_ID, "<|im_end|>": EOS_ID, "<|vision_start|>": VISION_START_ID,
                 "<|vision_end|>": VISION_END_ID, "<|image_pad|>": IMAGE_TOKEN_ID,
                 "<|video_pad|>": VIDEO_TOKEN_ID}

# Entities of the demo world whose pictures the three contexts carry (same size, different pixels).
SSR_ENTITY, FREEFORM_ENTITY, WARMUP_ENTITY = "eiffel-tower", "golden-gate-bridge", "great-pyramid"
QUESTION = "How tall is the structure in this image, in metres?"
ENGINES = ("sglang", "torch")


class CheckError(Exception):
    """A condition that ends the check with a message and an exit code (no traceback)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# ---------------------------------------------------------------------------------------------- shapes


@dataclass(frozen=True)
class Shape:
    """The shape of a Qwen3-VL checkpoint, as in its public ``config.json``."""

    name: str
    reference: str  # the public checkpoint this shape copies
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int = 128
    vocab_size: int = 151936
    tie_word_embeddings: bool = True
    rope_theta: float = 5_000_000.0
    mrope_section: tuple[int, int, int] = (24, 20, 20)  # sums to head_dim / 2
    max_position_embeddings: int = 262144
    vision_depth: int = 24
    vision_hidden_size: int = 1024
    vision_intermediate_size: int = 4096
    vision_heads: int = 16
    patch_size: int = 16
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    num_position_embeddings: int = 2304
    deepstack_visual_indexes: tuple[int, ...] = (5, 11, 17)

    def config_dict(self, dtype: str = "bfloat16") -> dict[str, Any]:
        """``config.json`` in the public checkpoints' form (legacy ``rope_scaling``/``rope_theta``, which
        every transformers and SGLang version that knows Qwen3-VL reads)."""
        return {
            "architectures": ["Qwen3VLForConditionalGeneration"],
            "model_type": "qwen3_vl",
            "dtype": dtype,
            "image_token_id": IMAGE_TOKEN_ID,
            "video_token_id": VIDEO_TOKEN_ID,
            "vision_start_token_id": VISION_START_ID,
            "vision_end_token_id": VISION_END_ID,
            "tie_word_embeddings": self.tie_word_embeddings,
            "text_config": {
                "model_type": "qwen3_vl_text",
                "attention_bias": False,
                "attention_dropout": 0.0,
                "bos_token_id": BOS_ID,
                "eos_token_id": EOS_ID,
                "dtype": dtype,
                "head_dim": self.head_dim,
                "hidden_act": "silu",
                "hidden_size": self.hidden_size,
                "initializer_range": 0.02,
                "intermediate_size": self.intermediate_size,
                "max_position_embeddings": self.max_position_embeddings,
                "num_attention_heads": self.num_attention_heads,
                "num_hidden_layers": self.num_hidden_layers,
                "num_key_value_heads": self.num_key_value_heads,
                "rms_norm_eps": 1e-6,
                "rope_scaling": {"mrope_interleaved": True, "mrope_section": list(self.mrope_section),
                                 "rope_type": "default"},
                "rope_theta": self.rope_theta,
                "tie_word_embeddings": self.tie_word_embeddings,
                "use_cache": True,
                "vocab_size": self.vocab_size,
            },
            "vision_config": {
                "model_type": "qwen3_vl",
                "deepstack_visual_indexes": list(self.deepstack_visual_indexes),
                "depth": self.vision_depth,
                "hidden_act": "gelu_pytorch_tanh",
                "hidden_size": self.vision_hidden_size,
                "in_channels": 3,
                "initializer_range": 0.02,
                "intermediate_size": self.vision_intermediate_size,
                "num_heads": self.vision_heads,
                "num_position_embeddings": self.num_position_embeddings,
                "out_hidden_size": self.hidden_size,
                "patch_size": self.patch_size,
                "spatial_merge_size": self.spatial_merge_size,
                "temporal_patch_size": self.temporal_patch_size,
            },
        }


SHAPES: dict[str, Shape] = {
    "2b": Shape(name="2b", reference="Qwen/Qwen3-VL-2B-Instruct", hidden_size=2048, intermediate_size=6144,
                num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8),
    "4b": Shape(name="4b", reference="Qwen/Qwen3-VL-4B-Instruct", hidden_size=2560, intermediate_size=9728,
                num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8),
}


def get_shape(shape: str | Shape) -> Shape:
    if isinstance(shape, Shape):
        return shape
    key = shape.lower().removeprefix("qwen3-vl-")
    try:
        return SHAPES[key]
    except KeyError:
        raise CheckError(EXIT_FAILED, f"unknown shape {shape!r}; known: {', '.join(SHAPES)}") from None


def qwen3vl_config(shape: str | Shape, dtype: str = "bfloat16") -> Any:
    """The ``Qwen3VLConfig`` that transformers reads from the shape's ``config.json``."""
    from transformers import Qwen3VLConfig

    return Qwen3VLConfig.from_dict(get_shape(shape).config_dict(dtype))


def _meta_model(shape: str | Shape, torch_dtype: Any) -> Any:
    """The model on the meta device (no memory) in ``torch_dtype``."""
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    config = qwen3vl_config(shape, str(torch_dtype).replace("torch.", ""))
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch_dtype)
    try:
        with torch.device("meta"):
            return Qwen3VLForConditionalGeneration(config)
    finally:
        torch.set_default_dtype(previous)


def count_parameters(shape: str | Shape) -> int:
    """Parameters of the shape (tied embeddings counted once), from a meta-device model."""
    import torch

    model = _meta_model(shape, torch.bfloat16)
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------------------------------------- build

_DTYPE_NAMES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
                "fp32": "float32", "float32": "float32"}


def _dtype_name(dtype: str) -> str:
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise CheckError(EXIT_FAILED, f"unknown dtype {dtype!r}; use bf16, fp16 or fp32") from None


def processor_config() -> dict[str, Any]:
    """The image-processor config of the public Qwen3-VL checkpoints (patch 16, merge 2, mean/std 0.5,
    64K..16M pixels). Written by hand: Qwen3VLProcessor.save_pretrained needs torchvision."""
    pixels = {"shortest_edge": 65536, "longest_edge": 16777216}
    return {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen3VLProcessor",
        "do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True,
        "rescale_factor": 1 / 255, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2, "size": pixels,
        "min_pixels": pixels["shortest_edge"], "max_pixels": pixels["longest_edge"], "resample": 3,
    }


def _stamp(shape: Shape, dtype: str, seed: int) -> dict[str, Any]:
    stamp = {"shape": asdict(shape), "dtype": dtype, "seed": seed, "version": 1}
    parsed: dict[str, Any] = json.loads(json.dumps(stamp))  # as read back (tuples become lists)
    return parsed


def _save_safetensors(state: dict[str, Any], out: Path, max_shard_bytes: int = MAX_SHARD_BYTES) -> int:
    """Write ``state`` as safetensors (sharded with an index past ``max_shard_bytes``); returns bytes."""
    from safetensors.torch import save_file

    shards: list[list[str]] = [[]]
    size, total = 0, 0
    for name in sorted(state):
        nbytes = state[name].numel() * state[name].element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
        total += nbytes
    files = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    weight_map: dict[str, str] = {}
    for fname, names in zip(files, shards, strict=True):
        tensors = {n: state[n].detach().to("cpu").contiguous() for n in names}
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, fname))
        del tensors
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    return total


def build_shape_model(shape: str | Shape, out_dir: str | os.PathLike[str], dtype: str = "bf16",
                      seed: int = 0, device: str = "cuda") -> Path:
    """Write a random-weight Qwen3-VL of ``shape`` to ``out_dir``, loadable by transformers and SGLang.

    The model is constructed on the meta device in ``dtype``, allocated once on ``device`` and filled
    there (N(0, 0.02) for matrices, 1 for norm weights, 0 for biases) from a seeded generator: seconds
    on a GPU, where transformers' default init (fp32 on the CPU, then a cast) takes minutes for 4B.
    A directory already holding the same build (its ``ssr_gpu_check.json``) is reused.
    """
    import torch

    from ssr_server.engine.tiny import build_tokenizer

    sh = get_shape(shape)
    dtype_name = _dtype_name(dtype)
    out = Path(out_dir)
    stamp_path = out / "ssr_gpu_check.json"
    stamp = _stamp(sh, dtype_name, seed)
    if stamp_path.exists() and json.loads(stamp_path.read_text()) == stamp:
        return out
    out.mkdir(parents=True, exist_ok=True)
    stamp_path.unlink(missing_ok=True)

    tok: Any = build_tokenizer("qwen")
    ids = {t: int(tok.convert_tokens_to_ids(t)) for t in _EXPECTED_IDS}
    if ids != _EXPECTED_IDS:
        raise CheckError(EXIT_FAILED, f"the Qwen tokenizer's special ids {ids} are not the real ones")
    if len(tok) > sh.vocab_size:
        raise CheckError(EXIT_FAILED, f"the tokenizer has {len(tok)} tokens > vocab_size {sh.vocab_size}")

    torch_dtype = getattr(torch, dtype_name)
    model = _meta_model(sh, torch_dtype)
    model = model.to_empty(device=device)
    model.tie_weights()
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02, generator=gen)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.fill_(1.0)  # RMSNorm / LayerNorm weights
    # Rotary inv_freq buffers are left unset: they are not persistent (not saved), and every loader
    # recomputes them; this model is never run.
    state = model.state_dict()
    if sh.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # as the public tied checkpoints (and save_pretrained) do
    for old in list(out.glob("model*.safetensors")) + list(out.glob("model.safetensors.index.json")):
        old.unlink()
    _save_safetensors(state, out)
    del state, model
    _free_device_memory()

    (out / "config.json").write_text(json.dumps(sh.config_dict(dtype_name), indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": BOS_ID, "eos_token_id": [EOS_ID, BOS_ID], "pad_token_id": BOS_ID}, indent=2))
    tok.save_pretrained(out)
    (out / "preprocessor_config.json").write_text(json.dumps(processor_config(), indent=1))
    stamp_path.write_text(json.dumps(stamp, indent=1))
    return out


def _free_device_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------- measure


@dataclass
class TurnRecord:
    turn: int
    compact_tokens: int  # len(context): one pad token per image
    context_tokens: int  # as the engine counts it (image expanded)
    ssr_ms: float
    freeform_ms: float
    selected: int
    ssr_cached_tokens: int  # the candidates' rows (min over rows)
    freeform_cached_tokens: int
    freeform_prompt_tokens: int
    ssr_first: bool


@dataclass
class Measurement:
    turns: list[TurnRecord] = field(default_factory=list)
    candidate_tokens: list[int] = field(default_factory=list)
    freeform_tokens: int = FREEFORM_TOKENS
    image_size: tuple[int, int] = IMAGE_SIZE
    warmup: int = DEFAULT_WARMUP


def _observation_text(turn: int, k: int = 5) -> tuple[str, str]:
    """A text_search query and its results as TextSearchTool shows them (numbered hits from the demo
    corpus; written out here so that the check does not need the search backend's dependencies)."""
    from ssr_server.demo.world import corpus_documents

    docs = corpus_documents()
    hits = [docs[(turn * k + i) % len(docs)] for i in range(k)]
    query = f"{hits[0]['title']} height"
    lines = [f"\n[{i}] {h['title']}: {h['text']} ({h['url']})" for i, h in enumerate(hits, start=1)]
    return query, f'Results for "{query}":' + "".join(lines)


async def measure(engine: Any, *, turns: int = DEFAULT_TURNS, warmup: int = DEFAULT_WARMUP,
                  freeform_tokens: int = FREEFORM_TOKENS, image_size: tuple[int, int] = IMAGE_SIZE,
                  log: Callable[[str], None] | None = None) -> Measurement:
    """Run ``warmup`` untimed and ``turns`` timed turns of SSR and freeform reasoning on ``engine``."""
    from ssr_server.agent.prompt import THINK_CLOSE, PromptBuilder
    from ssr_server.demo.world import render_image
    from ssr_server.engine.base import Context, GenerationParams, ImageRef
    from ssr_server.library import LibraryRegistry
    from ssr_server.selection import select

    builder = PromptBuilder(engine.tokenizer)
    cands = [list(c) for c in LibraryRegistry().get("default").candidate_token_ids(engine.tokenizer)]
    params = GenerationParams(max_new_tokens=freeform_tokens, temperature=0.0, ignore_eos=True)

    def start(entity: str) -> Context:
        return builder.start(QUESTION, [ImageRef.from_pil(render_image(entity, image_size))])

    def grow(ctx: Context, turn: int, selected: int) -> Context:
        query, text = _observation_text(turn)
        action = builder.encode(f"{THINK_CLOSE}<text_search>{query}</text_search>")
        return ctx.extend(list(cands[selected]) + list(action) + list(builder.observation(text, (), 1)))

    async def ssr(ctx: Context) -> tuple[float, int, Any]:
        t0 = time.perf_counter()
        scores = await engine.score(ctx, cands)
        sel = select([s.logprob_sum for s in scores], [s.num_tokens for s in scores], tau=0.0)
        return (time.perf_counter() - t0) * 1e3, sel.index, scores

    async def freeform(ctx: Context) -> tuple[float, Any]:
        t0 = time.perf_counter()
        gen = await engine.generate(ctx, params)
        ms = (time.perf_counter() - t0) * 1e3
        if len(gen.token_ids) != freeform_tokens:
            raise CheckError(EXIT_FAILED, f"freeform decoded {len(gen.token_ids)} tokens, not "
                                          f"{freeform_tokens} (ignore_eos not honoured?)")
        return ms, gen

    result = Measurement(candidate_tokens=[len(c) for c in cands], freeform_tokens=freeform_tokens,
                         image_size=image_size, warmup=warmup)
    warm = start(WARMUP_ENTITY)
    for i in range(warmup):
        _, selected, _ = await ssr(warm)
        await freeform(warm)
        warm = grow(warm, i, selected)
    if log:
        log(f"  warm-up done ({warmup} turns)")

    ctx_ssr, ctx_free = start(SSR_ENTITY), start(FREEFORM_ENTITY)
    for t in range(turns):
        ssr_first = t % 2 == 0
        if ssr_first:
            ssr_ms, selected, scores = await ssr(ctx_ssr)
            free_ms, gen = await freeform(ctx_free)
        else:
            free_ms, gen = await freeform(ctx_free)
            ssr_ms, selected, scores = await ssr(ctx_ssr)
        rec = TurnRecord(
            turn=t, compact_tokens=len(ctx_ssr), context_tokens=int(scores[0].context_tokens),
            ssr_ms=ssr_ms, freeform_ms=free_ms, selected=selected,
            ssr_cached_tokens=min(int(s.cached_tokens) for s in scores),
            freeform_cached_tokens=int(gen.cached_tokens), freeform_prompt_tokens=int(gen.prompt_tokens),
            ssr_first=ssr_first)
        result.turns.append(rec)
        if log:
            log(f"  turn {t:>2}: context {rec.context_tokens:>5} tokens  ssr {ssr_ms:8.1f} ms  "
                f"freeform {free_ms:8.1f} ms")
        # Both contexts grow by the same tokens (SSR's selection), so their lengths stay equal.
        ctx_ssr, ctx_free = grow(ctx_ssr, t, selected), grow(ctx_free, t, selected)
    return result


def _p95(xs: Sequence[float]) -> float:
    """The 95th percentile, linear interpolation between closest ranks (numpy's default)."""
    s = sorted(xs)
    if len(s) == 1:
        return float(s[0])
    pos = 0.95 * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return float(s[lo] + (s[hi] - s[lo]) * (pos - lo))


def _stats(xs: Sequence[float]) -> dict[str, float]:
    return {"mean_ms": float(statistics.fmean(xs)), "p50_ms": float(statistics.median(xs)),
            "p95_ms": _p95(xs), "min_ms": float(min(xs)), "max_ms": float(max(xs))}


def summarize(m: Measurement) -> dict[str, Any]:
    """The figures of one shape from its turn records."""
    if not m.turns:
        raise CheckError(EXIT_FAILED, "no turns were measured")
    ssr = _stats([r.ssr_ms for r in m.turns])
    free = _stats([r.freeform_ms for r in m.turns])
    decode_ms = free["mean_ms"] / m.freeform_tokens
    # Prefix-cache reuse: from turn 1 on, a call should find (almost all of) the previous turn's context
    # cached. For SGLang's route, a row's cached_tokens counts the context cached by the route's first
    # call; for the embedded engine it counts the prefix found before the prefill.
    pairs = list(zip(m.turns[:-1], m.turns[1:], strict=True))
    reuse_ssr = [min(1.0, r.ssr_cached_tokens / max(1, p.context_tokens)) for p, r in pairs]
    reuse_free = [min(1.0, r.freeform_cached_tokens / max(1, p.freeform_prompt_tokens)) for p, r in pairs]
    cache = {
        "ssr_min_reuse": min(reuse_ssr, default=None),
        "freeform_min_reuse": min(reuse_free, default=None),
        "floor": CACHE_REUSE_FLOOR,
    }
    cache["ok"] = bool(reuse_ssr and reuse_free and min(reuse_ssr) >= CACHE_REUSE_FLOOR
                       and min(reuse_free) >= CACHE_REUSE_FLOOR)
    return {
        "ssr": ssr, "freeform": free,
        "reduction_pct": 100.0 * (1.0 - ssr["mean_ms"] / free["mean_ms"]),
        "p95_reduction_pct": 100.0 * (1.0 - ssr["p95_ms"] / free["p95_ms"]),
        "decode_ms_per_token": decode_ms,
        "scoring_cost_decode_steps": ssr["mean_ms"] / decode_ms,
        "freeform_tokens": m.freeform_tokens,
        "context_tokens_first": m.turns[0].context_tokens,
        "context_tokens_last": m.turns[-1].context_tokens,
        "candidate_tokens": m.candidate_tokens,
        "image_size": list(m.image_size),
        "turns": len(m.turns), "warmup": m.warmup,
        "cache": cache,
        "per_turn": [asdict(r) for r in m.turns],
    }


# ---------------------------------------------------------------------------------------------- SGLang


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_command(model_dir: str | os.PathLike[str], port: int | str, *, python: str | None = None,
                   mem_fraction: float = MEM_FRACTION_STATIC, extra_args: Sequence[str] = ()) -> list[str]:
    return [python or sys.executable, "-m", "ssr_server.engine.sglang.server", "--model-path", str(model_dir),
            "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16",
            "--mem-fraction-static", f"{mem_fraction:g}", *extra_args]


def _child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the SGLang interpreter: offline, and this project importable without install."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": f"{root}{os.pathsep}{path}" if path else root, **(extra or {})}


def check_sglang(python: str | None = None) -> str:
    """SGLang's version as the server's interpreter imports it (with our route module); CheckError if not."""
    exe = python or sys.executable
    code = "import sglang, ssr_server.engine.sglang.server; print(sglang.__version__)"
    try:
        proc = subprocess.run([exe, "-c", code], capture_output=True, text=True, timeout=300,
                              env=_child_env())
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CheckError(EXIT_NO_SGLANG, f"cannot run {exe} to import sglang: {e}") from None
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise CheckError(EXIT_NO_SGLANG, (
            f"`import sglang` failed in {exe}:\n{tail}\n"
            "The sglang engine needs SGLang's GPU install in this environment (e.g. the lmsysorg/sglang "
            "image, with this project installed by `pip install --no-deps -e .`), or --sglang-python "
            "pointing at an interpreter that has both; or use --engine torch."))
    return proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "?"


def _log_tail(path: Path, lines: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _stop_group(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    """Stop the server we started: SIGTERM to its process group (its PID: it leads a new session, so
    the group holds only it and its children), then SIGKILL after ``timeout_s``."""
    pgid = proc.pid
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 15.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(0.2)
            try:
                os.killpg(pgid, 0)  # anyone left in the group (the scheduler, the detokenizer)?
            except ProcessLookupError:
                return
            time.sleep(0.2)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


@contextlib.contextmanager
def sglang_server(model_dir: Path, port: int, log_path: Path, *, python: str | None = None,
                  mem_fraction: float = MEM_FRACTION_STATIC, extra_args: Sequence[str] = (),
                  env: dict[str, str] | None = None, timeout_s: float = HEALTH_TIMEOUT_S,
                  log: Callable[[str], None] = print) -> Iterator[str]:
    """Start SGLang (with /ssr/score) on 127.0.0.1:port, wait for /health, yield its URL; always stop it."""
    import httpx

    cmd = server_command(model_dir, port, python=python, mem_fraction=mem_fraction, extra_args=extra_args)
    full_env = _child_env(env)
    log(f"  starting SGLang: {' '.join(cmd)}")
    log(f"  server log: {log_path}")
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=full_env, start_new_session=True)
    try:
        t0 = time.monotonic()
        with httpx.Client(trust_env=False, timeout=5.0) as client:
            while True:
                if proc.poll() is not None:
                    raise CheckError(EXIT_FAILED, f"SGLang exited with {proc.returncode} before /health; "
                                                  f"log tail ({log_path}):\n{_log_tail(log_path)}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(url + "/health").status_code == 200:
                        break
                if time.monotonic() - t0 > timeout_s:
                    raise CheckError(EXIT_FAILED, f"SGLang did not answer /health in {timeout_s:.0f} s; "
                                                  f"log tail ({log_path}):\n{_log_tail(log_path)}")
                time.sleep(1.0)
        log(f"  SGLang ready in {time.monotonic() - t0:.0f} s (pid {proc.pid})")
        yield url
    finally:
        _stop_group(proc)
        log(f"  SGLang stopped (pid {proc.pid})")


# ---------------------------------------------------------------------------------------------- the check


def _versions(sglang_version: str | None) -> dict[str, str]:
    import torch
    import transformers

    out = {"python": sys.version.split()[0], "torch": str(torch.__version__),
           "transformers": str(transformers.__version__), "cuda": str(torch.version.cuda)}
    if sglang_version:
        out["sglang"] = sglang_version
    return out


def _gpu_info() -> dict[str, Any]:
    import torch

    props = torch.cuda.get_device_properties(0)
    return {"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
            "count": torch.cuda.device_count(), "capability": f"{props.major}.{props.minor}"}


def plan(shapes: Sequence[str | Shape], engine: str, turns: int, warmup: int, freeform_tokens: int,
         work_dir: str, port: int | None, *, python: str | None = None,
         mem_fraction: float = MEM_FRACTION_STATIC, extra_args: Sequence[str] = ()) -> list[dict[str, Any]]:
    """What the check will do per shape (configs and parameter counts only: no weights)."""
    steps = []
    for s in shapes:
        sh = get_shape(s)
        config = qwen3vl_config(sh)  # validates the config as transformers reads it
        tc = config.text_config
        model_dir = str(Path(work_dir) / f"qwen3-vl-{sh.name}")
        step: dict[str, Any] = {
            "shape": sh.name, "reference": sh.reference, "params": count_parameters(sh),
            "text": {"hidden": tc.hidden_size, "layers": tc.num_hidden_layers,
                     "heads": tc.num_attention_heads, "kv_heads": tc.num_key_value_heads,
                     "head_dim": tc.head_dim, "intermediate": tc.intermediate_size,
                     "vocab": tc.vocab_size, "rope": dict(tc.rope_parameters or {})},
            "vision": {"depth": config.vision_config.depth, "hidden": config.vision_config.hidden_size,
                       "out_hidden": config.vision_config.out_hidden_size,
                       "deepstack": list(config.vision_config.deepstack_visual_indexes)},
            "model_dir": model_dir,
            "measure": {"warmup": warmup, "turns": turns, "ssr": "score 6 default candidates + select",
                        "freeform": f"generate {freeform_tokens} tokens, greedy, ignore_eos",
                        "image_size": list(IMAGE_SIZE)},
        }
        if engine == "sglang":
            cmd = server_command(model_dir, port or "<free port>", python=python, mem_fraction=mem_fraction,
                                 extra_args=extra_args)
            step["server"] = " ".join(cmd)
        else:
            step["engine"] = f"TorchEngine({model_dir!r}, device='cuda', dtype='bf16')"
        steps.append(step)
    return steps


def format_plan(steps: Sequence[dict[str, Any]], engine: str) -> str:
    lines = [f"GPU check plan (engine {engine}); nothing is built in a dry run:"]
    for st in steps:
        t, v = st["text"], st["vision"]
        lines += [
            f"- {st['shape']}: random {st['reference']} shape, {st['params'] / 1e9:.2f}B parameters, bf16",
            f"    text: hidden {t['hidden']}, {t['layers']} layers, {t['heads']} heads / {t['kv_heads']} KV, "
            f"head_dim {t['head_dim']}, intermediate {t['intermediate']}, vocab {t['vocab']}, "
            f"rope {t['rope']}",
            f"    vision: depth {v['depth']}, hidden {v['hidden']}, out {v['out_hidden']}, "
            f"deepstack {v['deepstack']}",
            f"    build: {st['model_dir']} (safetensors, real Qwen tokenizer, Qwen3-VL processor config)",
        ]
        if "server" in st:
            lines.append(f"    serve: {st['server']}; wait for /health")
        else:
            lines.append(f"    load: {st['engine']}")
        m = st["measure"]
        lines.append(f"    measure: {m['warmup']} warm-up + {m['turns']} turns; SSR = {m['ssr']}; "
                     f"freeform = {m['freeform']}; image {m['image_size'][0]}x{m['image_size'][1]}")
    return "\n".join(lines)


def format_table(result: dict[str, Any]) -> str:
    gpu = result.get("gpu", {})
    lines = [
        f"GPU check - engine {result['engine']}, {gpu.get('name', '?')} ({gpu.get('memory_gib', '?')} GiB), "
        f"{result['dtype']}, {result['turns']} turns after {result['warmup']} warm-up, freeform "
        f"{result['freeform_tokens']} tokens, 6 candidates",
        "",
        f"{'shape':<6}{'params':>8}{'context':>14}{'ssr mean':>10}{'ssr p95':>9}{'free mean':>11}"
        f"{'free p95':>10}{'reduction':>11}{'decode':>9}{'scoring cost':>14}  cache",
        f"{'':<6}{'':>8}{'tokens':>14}{'ms':>10}{'ms':>9}{'ms':>11}{'ms':>10}{'%':>11}{'ms/tok':>9}"
        f"{'decode steps':>14}",
    ]
    for name, r in result["shapes"].items():
        if "error" in r:
            lines.append(f"{name:<6}  FAILED: {r['error'].splitlines()[0]}")
            continue
        ctx = f"{r['context_tokens_first']}-{r['context_tokens_last']}"
        c = r["cache"]
        cache = "n/a"
        if c["ssr_min_reuse"] is not None and c["freeform_min_reuse"] is not None:
            cache = (f"{'ok' if c['ok'] else 'LOW'} (ssr {c['ssr_min_reuse']:.2f}, "
                     f"free {c['freeform_min_reuse']:.2f})")
        lines.append(
            f"{name:<6}{r['params'] / 1e9:>7.2f}B{ctx:>14}"
            f"{r['ssr']['mean_ms']:>10.1f}{r['ssr']['p95_ms']:>9.1f}"
            f"{r['freeform']['mean_ms']:>11.1f}{r['freeform']['p95_ms']:>10.1f}{r['reduction_pct']:>10.1f}%"
            f"{r['decode_ms_per_token']:>9.2f}{r['scoring_cost_decode_steps']:>14.1f}  {cache}")
    lines += ["", "reduction = 1 - ssr mean / freeform mean; decode ms/tok = freeform mean / "
              f"{result['freeform_tokens']}; scoring cost = ssr mean / decode ms per token; cache = min "
              "fraction of the previous turn's context found cached (turns 1..n)"]
    return "\n".join(lines)


def _write_json(path: str | None, result: dict[str, Any]) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(path).with_name(Path(path).name + ".tmp")
        tmp.write_text(json.dumps(result, indent=1))
        os.replace(tmp, path)


def run_gpu_check(shapes: Sequence[str | Shape] = ("2b", "4b"), engine: str = "sglang",
                  turns: int = DEFAULT_TURNS, port: int | None = None, json_path: str | None = None, *,
                  dry_run: bool = False, warmup: int = DEFAULT_WARMUP, freeform_tokens: int = FREEFORM_TOKENS,
                  work_dir: str | None = None, keep_models: bool = False, seed: int = 0,
                  sglang_python: str | None = None, mem_fraction: float = MEM_FRACTION_STATIC,
                  sglang_args: Sequence[str] = (), start_timeout_s: float = HEALTH_TIMEOUT_S,
                  require_cuda: bool = True, device: str = "cuda", dtype: str = "bf16",
                  sglang_env: dict[str, str] | None = None,
                  log: Callable[[str], None] = print) -> dict[str, Any]:
    """Build, serve and measure each shape; see the module docstring. Raises ``CheckError``.

    ``require_cuda=False`` with ``device``/``dtype``/``sglang_args``/``sglang_env`` lets the same code run
    against the SGLang CPU harness on small shapes (a self-test); the figures then mean nothing.
    """
    if engine not in ENGINES:
        raise CheckError(EXIT_FAILED, f"engine must be one of {ENGINES}, not {engine!r}")
    if turns < 2 or warmup < 0 or freeform_tokens < 1:
        raise CheckError(EXIT_FAILED, "need turns >= 2, warmup >= 0 and freeform_tokens >= 1")
    shape_list = [get_shape(s) for s in shapes]
    if not shape_list:
        raise CheckError(EXIT_FAILED, "no shape to check")
    root = work_dir or os.path.join(tempfile.gettempdir(), "ssr-gpu-check")

    if dry_run:
        steps = plan(shape_list, engine, turns, warmup, freeform_tokens, root, port, python=sglang_python,
                     mem_fraction=mem_fraction, extra_args=sglang_args)
        log(format_plan(steps, engine))
        result: dict[str, Any] = {"dry_run": True, "engine": engine, "plan": steps}
        _write_json(json_path, result)
        return result

    import torch

    if require_cuda and not torch.cuda.is_available():
        raise CheckError(EXIT_NO_GPU, "no CUDA GPU is visible (torch.cuda.is_available() is False): the GPU "
                                      "check runs only on a machine with an NVIDIA GPU and CUDA torch. Use "
                                      "--dry-run to print the plan here.")
    sglang_version = check_sglang(sglang_python) if engine == "sglang" else None
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    Path(root).mkdir(parents=True, exist_ok=True)
    result = {
        "dry_run": False, "engine": engine, "turns": turns, "warmup": warmup,
        "freeform_tokens": freeform_tokens, "dtype": _dtype_name(dtype),
        "gpu": _gpu_info() if torch.cuda.is_available() else {"name": "none (cpu self-test)"},
        "versions": _versions(sglang_version), "work_dir": root, "shapes": {},
    }
    for sh in shape_list:
        try:
            result["shapes"][sh.name] = _check_shape(
                sh, Path(root), engine, port, turns, warmup, freeform_tokens, keep_models, seed, device,
                dtype, sglang_python, mem_fraction, sglang_args, sglang_env, start_timeout_s, log)
        except (CheckError, Exception) as e:  # record it and go on with the next shape
            message = e.message if isinstance(e, CheckError) else f"{type(e).__name__}: {e}"
            if not isinstance(e, CheckError):
                log(traceback.format_exc())
            log(f"[{sh.name}] FAILED: {message}")
            result["shapes"][sh.name] = {"reference": sh.reference, "error": message}
        _write_json(json_path, result)
    result["ok"] = all("error" not in r for r in result["shapes"].values())
    _write_json(json_path, result)
    log("")
    log(format_table(result))
    return result


def _check_shape(sh: Shape, root: Path, engine: str, port: int | None, turns: int, warmup: int,
                 freeform_tokens: int, keep_models: bool, seed: int, device: str, dtype: str,
                 python: str | None, mem_fraction: float, extra_args: Sequence[str],
                 env: dict[str, str] | None, timeout_s: float, log: Callable[[str], None]) -> dict[str, Any]:
    log(f"[{sh.name}] building a random {sh.reference}-shaped model ...")
    model_dir = root / f"qwen3-vl-{sh.name}"
    t0 = time.perf_counter()
    try:
        build_shape_model(sh, model_dir, dtype=dtype, seed=seed, device=device)
        build_s = time.perf_counter() - t0
        params = count_parameters(sh)
        log(f"[{sh.name}] {params / 1e9:.2f}B parameters in {model_dir} ({build_s:.0f} s)")
        if engine == "sglang":
            m = _measure_sglang(model_dir, sh, port, turns, warmup, freeform_tokens, python, mem_fraction,
                                extra_args, env, timeout_s, log)
        else:
            m = _measure_torch(model_dir, turns, warmup, freeform_tokens, device, dtype, log)
    finally:
        if not keep_models:
            shutil.rmtree(model_dir, ignore_errors=True)
    summary = summarize(m)
    log(f"[{sh.name}] ssr {summary['ssr']['mean_ms']:.1f} ms (p95 {summary['ssr']['p95_ms']:.1f}), "
        f"freeform {summary['freeform']['mean_ms']:.1f} ms (p95 {summary['freeform']['p95_ms']:.1f}), "
        f"reduction {summary['reduction_pct']:.1f}%, scoring = "
        f"{summary['scoring_cost_decode_steps']:.1f} decode steps")
    return {"reference": sh.reference, "params": params, "build_s": round(build_s, 1), **summary}


def _measure_sglang(model_dir: Path, sh: Shape, port: int | None, turns: int, warmup: int,
                    freeform_tokens: int, python: str | None, mem_fraction: float, extra_args: Sequence[str],
                    env: dict[str, str] | None, timeout_s: float, log: Callable[[str], None]) -> Measurement:
    from ssr_server.engine.sglang.client import SGLangEngine

    p = port or _free_port()
    log_path = model_dir.parent / f"sglang-{sh.name}.log"
    with sglang_server(model_dir, p, log_path, python=python, mem_fraction=mem_fraction,
                       extra_args=extra_args, env=env, timeout_s=timeout_s, log=log) as url:

        async def go() -> Measurement:
            eng = SGLangEngine(url, model=str(model_dir), scoring="route", timeout_s=600.0)
            try:
                return await measure(eng, turns=turns, warmup=warmup, freeform_tokens=freeform_tokens,
                                     log=log)
            finally:
                await eng.close()

        return asyncio.run(go())


def _measure_torch(model_dir: Path, turns: int, warmup: int, freeform_tokens: int, device: str, dtype: str,
                   log: Callable[[str], None]) -> Measurement:
    from ssr_server.engine.torch.engine import TorchEngine

    async def go() -> Measurement:
        eng = TorchEngine(str(model_dir), dtype=dtype, device=device, cache_bytes=TORCH_CACHE_BYTES)
        try:
            return await measure(eng, turns=turns, warmup=warmup, freeform_tokens=freeform_tokens, log=log)
        finally:
            await eng.close()

    try:
        return asyncio.run(go())
    finally:
        _free_device_memory()


# ---------------------------------------------------------------------------------------------- CLI


def _on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks: the server is stopped


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m ssr_server.bench.gpu_check",
        description="SSR vs freeform per-turn reasoning latency on random Qwen3-VL-2B/4B-shaped models "
                    "(NVIDIA GPU only; no model hub).")
    ap.add_argument("--shape", action="append", choices=sorted(SHAPES), default=None,
                    help="repeatable (default: 2b and 4b)")
    ap.add_argument("--engine", choices=ENGINES, default="sglang")
    ap.add_argument("--turns", type=int, default=DEFAULT_TURNS)
    ap.add_argument("--warmup", type=int, default=DEFAULT_WARMUP)
    ap.add_argument("--port", type=int, default=None, help="SGLang's port (default: a free one)")
    ap.add_argument("--json", dest="json_path", default=None, help="write the results here")
    ap.add_argument("--work-dir", default=None,
                    help="where the models are built (default: $TMPDIR/ssr-gpu-check)")
    ap.add_argument("--keep-models", action="store_true", help="keep the built models (reused next time)")
    ap.add_argument("--sglang-python", default=None, help="interpreter with SGLang (default: this one)")
    ap.add_argument("--mem-fraction-static", type=float, default=MEM_FRACTION_STATIC)
    ap.add_argument("--start-timeout", type=float, default=HEALTH_TIMEOUT_S,
                    help="seconds to wait for /health")
    ap.add_argument("--sglang-arg", action="append", default=[], metavar="ARG",
                    help="extra SGLang flag, repeatable (e.g. --sglang-arg=--attention-backend=fa3)")
    ap.add_argument("--dry-run", action="store_true", help="build the configs only and print the plan")
    a = ap.parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        result = run_gpu_check(shapes=a.shape or ("2b", "4b"), engine=a.engine, turns=a.turns, port=a.port,
                      json_path=a.json_path, dry_run=a.dry_run, warmup=a.warmup, work_dir=a.work_dir,
                      keep_models=a.keep_models, sglang_python=a.sglang_python,
                      mem_fraction=a.mem_fraction_static, sglang_args=a.sglang_arg,
                      start_timeout_s=a.start_timeout)
    except CheckError as e:
        print(f"gpu-check: {e.message}", file=sys.stderr)
        return e.code
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not result.get("ok", True):
        print("gpu-check: some shapes failed (see above)", file=sys.stderr)
        return EXIT_FAILED
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

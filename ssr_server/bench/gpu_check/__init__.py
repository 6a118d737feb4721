"""GPU check: per-turn reasoning latency of SSR vs freeform on random Qwen3-VL-2B/4B-shaped models.

For a machine with an NVIDIA GPU and no model hub. For each shape it

1. builds a random-weight Qwen3VLForConditionalGeneration of the public config's shape (``shapes``,
   embedded, no download) on the GPU and saves it with the real Qwen vocabulary (``build``);
2. serves it: ``engine="sglang"`` starts SGLang's server with our ``/ssr/score`` route (``server``;
   SGLang's GPU install must be present, e.g. the lmsysorg/sglang image); ``engine="torch"`` loads it
   in the embedded ``TorchEngine``;
3. measures ``turns`` agent turns after warm-up (``measure``): per turn, SSR reasoning is ONE
   ``engine.score`` of the default six candidates plus the selection; freeform reasoning is
   ``engine.generate`` of exactly 128 tokens (greedy, EOS ignored), on two contexts of equal length
   that differ only in their image, growing like a real run's.

It reports per shape mean and p95 of both, the reduction, decode ms per token, the scoring cost in
decode steps and a prefix-cache check (``check``). Without CUDA it refuses (exit code 2) unless
``dry_run``; without SGLang (``engine="sglang"``) it exits with code 3.

    python -m ssr_server.bench.gpu_check --shape 2b --shape 4b --engine sglang --turns 20 --json out.json
"""

from ssr_server.bench.gpu_check.build import _save_safetensors, build_shape_model, processor_config
from ssr_server.bench.gpu_check.check import main, run_gpu_check
from ssr_server.bench.gpu_check.measure import Measurement, TurnRecord, _p95, measure, summarize
from ssr_server.bench.gpu_check.shapes import SHAPES, Shape, count_parameters, qwen3vl_config

__all__ = [
    "SHAPES", "Measurement", "Shape", "TurnRecord", "_p95", "_save_safetensors", "build_shape_model",
    "count_parameters", "main", "measure", "processor_config", "qwen3vl_config", "run_gpu_check",
    "summarize",
]

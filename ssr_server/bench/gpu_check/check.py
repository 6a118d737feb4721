"""The check itself: plan, run per shape, report, CLI."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ssr_server.bench.gpu_check.build import _dtype_name, _free_device_memory, build_shape_model
from ssr_server.bench.gpu_check.common import (
    DEFAULT_TURNS,
    DEFAULT_WARMUP,
    ENGINES,
    EXIT_FAILED,
    EXIT_NO_GPU,
    FREEFORM_TOKENS,
    HEALTH_TIMEOUT_S,
    IMAGE_SIZE,
    MEM_FRACTION_STATIC,
    TORCH_CACHE_BYTES,
    CheckError,
)
from ssr_server.bench.gpu_check.measure import Measurement, measure, summarize
from ssr_server.bench.gpu_check.server import _free_port, check_sglang, server_command, sglang_server
from ssr_server.bench.gpu_check.shapes import (
    REHEARSAL_SHAPES,
    SHAPES,
    Shape,
    count_parameters,
    get_shape,
    qwen3vl_config,
)

# ---------------------------------------------------------------------------------------------- the check

REHEARSAL_TURNS = 4  # enough to cross the prefix cache and every path; seconds on a CPU


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
            step["engine"] = f"TorchEngine({model_dir!r}, EngineConfig(device='cuda', dtype='bf16'))"
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
        if engine == "torch":  # rehearse the whole check on the CPU with tiny stand-ins of the shapes
            log("rehearsal on the CPU (fp32) with tiny stand-ins of the shapes; the figures mean nothing")
            tiny = [REHEARSAL_SHAPES.get(sh.name, sh) for sh in shape_list]
            result["rehearsal"] = run_gpu_check(
                tiny, "torch", min(turns, REHEARSAL_TURNS), json_path=None, warmup=min(warmup, 1),
                freeform_tokens=freeform_tokens, work_dir=os.path.join(root, "rehearsal"),
                keep_models=keep_models, seed=seed, require_cuda=False, device="cpu", dtype="fp32", log=log)
            result["ok"] = result["rehearsal"]["ok"]
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
    started = time.perf_counter()
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
    result["ok"] = all("error" not in r and r.get("checks_ok", True) for r in result["shapes"].values())
    result["elapsed_s"] = round(time.perf_counter() - started, 1)
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
            m, checks = _measure_torch(model_dir, turns, warmup, freeform_tokens, device, dtype, log)
    finally:
        if not keep_models:
            shutil.rmtree(model_dir, ignore_errors=True)
    summary = summarize(m)
    if engine == "torch":
        summary["checks"] = checks
        summary["checks_ok"] = bool(checks["packed_vs_naive_ok"] and checks["greedy_equal"])
        ok = "ok" if checks["packed_vs_naive_ok"] else "FAIL"
        log(f"[{sh.name}] packed vs naive: max |diff| {checks['packed_vs_naive_max_abs_diff']:.2e} "
            f"(<= {checks['packed_vs_naive_tolerance']:g}: {ok}); greedy vs transformers' generate: "
            f"{'equal' if checks['greedy_equal'] else 'DIFFERENT'} "
            f"({checks['greedy_common_prefix']} of {checks['greedy_tokens']} tokens in common)")
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
                   log: Callable[[str], None]) -> tuple[Measurement, dict[str, Any]]:
    from ssr_server.bench.gpu_check.torch_checks import run_checks
    from ssr_server.engine.torch.config import EngineConfig
    from ssr_server.engine.torch.engine import TorchEngine

    async def go() -> tuple[Measurement, dict[str, Any]]:
        config = EngineConfig(device=device, dtype=dtype, prefix_cache_bytes=TORCH_CACHE_BYTES)
        eng = TorchEngine(str(model_dir), config)
        try:
            m = await measure(eng, turns=turns, warmup=warmup, freeform_tokens=freeform_tokens, log=log)
            checks = await run_checks(eng, m.last_context, m.candidates, _dtype_name(dtype))
            return m, checks
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

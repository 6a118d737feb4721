#!/usr/bin/env bash
# SGLang CPU test harness: a real SGLang 0.5.23 server (scheduler, radix cache, HTTP) on a CPU-only
# machine, serving tiny local models, with the project's /ssr/score route mounted inside it.
# Test harness only: production runs SGLang's own GPU install. Recipe: shared notes "sglang-on-cpu".
#
#   scripts/sglang-cpu.sh venv                          build (or reuse) SGLang's own venv
#   scripts/sglang-cpu.sh start MODEL_DIR PORT [flags]  start the server in the background, wait for /health
#   scripts/sglang-cpu.sh stop PORT                     stop it (the python PID), wait for its children
#   scripts/sglang-cpu.sh status PORT                   exit 0 when the server on PORT is healthy
#
# Environment:
#   SSR_SGLANG_VENV     venv path (default: <repo>/.sglang-venv)
#   SSR_SGLANG_PYTHON   interpreter to build the venv from (default: python3)
#   SSR_SGLANG_RUN_DIR  pidfiles and logs (default: /tmp/ssr-sglang)
#   SSR_SGLANG_START_TIMEOUT  seconds to wait for /health (default: 180; 25-50 s is usual here)
set -euo pipefail

SCRIPT_PATH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
SCRIPT_DIR="$(dirname "$SCRIPT_PATH")"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
STUB_DIR="$SCRIPT_DIR/sglang_stubs"
# shellcheck source=scripts/progress.sh
. "$SCRIPT_DIR/progress.sh"
VENV="${SSR_SGLANG_VENV:-$REPO_ROOT/.sglang-venv}"
case "$VENV" in /*) ;; *) VENV="$REPO_ROOT/$VENV" ;; esac
BASE_PYTHON="${SSR_SGLANG_PYTHON:-python3}"
RUN_DIR="${SSR_SGLANG_RUN_DIR:-/tmp/ssr-sglang}"
START_TIMEOUT="${SSR_SGLANG_START_TIMEOUT:-180}"
STAMP="$VENV/.ssr-sglang-stamp"

SGLANG_VERSION="0.5.23"
TORCH_VERSION="2.13.0"
# What SGLang really imports on the CPU text and vision-language path (found by trial).
REAL_IMPORTS=(
  "transformers==5.19.0" "tokenizers==0.23.2" fastapi "uvicorn>=0.51" uvloop pyzmq orjson msgspec pybase64
  psutil requests aiohttp pydantic numpy pillow safetensors "sentencepiece==0.2.1" setproctitle
  python-multipart prometheus-client interegular partial_json_parser einops packaging tqdm xxhash regex
  "openai==2.8.0" zstandard IPython dill "apache-tvm-ffi==0.1.11" "compressed-tensors==0.18.0" gguf
  jsonschema "xgrammar==0.2.7" "soundfile==0.13.1"
)

log() { printf '[sglang-cpu] %s\n' "$*" >&2; }
die() { printf '[sglang-cpu] ERROR: %s\n' "$*" >&2; exit 1; }

source_hash() {
  # Hash of everything the venv is built from: this script and the stub package sources.
  (
    cd "$SCRIPT_DIR"
    {
      echo "python=$("$BASE_PYTHON" -c 'import sys; print(sys.version)')"
      sha256sum "$(basename "$SCRIPT_PATH")" progress.sh
      find sglang_stubs -type f \( -name '*.py' -o -name '*.toml' \) -not -path '*/__pycache__/*' \
        -not -path '*.egg-info/*' -not -path '*/build/*' | LC_ALL=C sort | xargs sha256sum
    } | sha256sum | cut -d' ' -f1
  )
}

venv_is_current() {
  [[ -f "$STAMP" && -x "$VENV/bin/python" ]] && [[ "$(cat "$STAMP")" == "$(source_hash)" ]]
}

patch_torchvision() {
  # PyPI's torchvision 0.28.0 is a CUDA build; its compiled ops need libtorch_cuda. Its pure-Python parts
  # work when the fake-op registrations are made conditional on the compiled ops being present.
  "$VENV/bin/python" - <<'PY'
import pathlib, re, sysconfig
path = pathlib.Path(sysconfig.get_paths()["purelib"]) / "torchvision" / "_meta_registrations.py"
src = path.read_text()
marker = "# ssr-server: register_fake made conditional"
if marker in src:
    print(f"already patched: {path}")
    raise SystemExit(0)
pattern = re.compile(r"@torch\.library\.register_fake\(")
n = len(pattern.findall(src))
if n == 0:
    raise SystemExit(f"no @torch.library.register_fake( decorators found in {path}: recipe out of date")
src = pattern.sub("@_ssr_register_fake(", src)
helper = f'''
{marker}: torchvision's compiled ops are missing on CPU torch,
# so registering fakes for them would fail at import time.
def _ssr_register_fake(*args, **kwargs):
    import torchvision.extension

    if torchvision.extension._has_ops():
        return torch.library.register_fake(*args, **kwargs)
    return lambda fn: fn

'''
# insert the helper after the import block (before the first decorator / def)
first = min(i for i in (src.find("\n@"), src.find("\ndef ")) if i >= 0)
src = src[:first] + "\n" + helper + src[first:]
path.write_text(src)
print(f"patched {n} register_fake decorators in {path}")
PY
}

cmd_venv() {
  # One builder at a time (two test sessions may ask at once); the second then finds it current.
  mkdir -p "$RUN_DIR"
  exec 9>"$RUN_DIR/venv-$(echo "$VENV" | sha256sum | cut -c1-16).lock"
  if ! flock -n 9; then
    log "another build of $VENV is running: waiting for it"
    flock 9
  fi
  if venv_is_current; then
    log "venv up to date: $VENV"
    return 0
  fi
  local t0=$SECONDS
  local want
  want="$(source_hash)"
  if [[ -e "$VENV" ]]; then
    [[ -f "$VENV/pyvenv.cfg" ]] || die "$VENV exists but is not a venv: not deleting it"
    log "venv stale (sources changed) or unfinished: rebuilding $VENV"
    rm -rf "$VENV"
  fi
  log "creating venv at $VENV (70-150 s here) with $("$BASE_PYTHON" --version 2>&1)"
  "$BASE_PYTHON" -m venv "$VENV"
  local pip=("$VENV/bin/python" -m pip install -q --progress-bar off)
  # Our own cap so nothing pulls a CUDA torch in as a dependency.
  local cons="$VENV/ssr-constraints.txt"
  printf 'torch==%s\n' "$TORCH_VERSION" >"$cons"

  progress_step "[sglang-cpu] 1/6 torch==$TORCH_VERSION (CPU wheel)" "${pip[@]}" -c "$cons" "torch==$TORCH_VERSION"
  progress_step "[sglang-cpu] 2/6 sglang==$SGLANG_VERSION triton torchvision (no deps)" \
    "${pip[@]}" -c "$cons" --no-deps "sglang==$SGLANG_VERSION" "triton==3.9.0" "torchvision==0.28.0"
  progress_step "[sglang-cpu] 3/6 the packages SGLang really imports on the CPU path" \
    "${pip[@]}" -c "$cons" "${REAL_IMPORTS[@]}"
  log "4/6 patching torchvision's fake-op registrations"
  patch_torchvision
  log "5/6 stand-in sgl_kernel from $STUB_DIR"
  # a copy, so the build never writes into the source tree
  local stub_tmp
  stub_tmp="$(mktemp -d)"
  cp -r "$STUB_DIR/." "$stub_tmp/"
  "${pip[@]}" --no-deps --no-build-isolation "$stub_tmp"
  rm -rf "$stub_tmp"
  progress_step "[sglang-cpu] 6/6 this project (editable, no deps; typer for the ssr-server CLI entry)" \
    "${pip[@]}" --no-deps --no-build-isolation -e "$REPO_ROOT"
  "${pip[@]}" -c "$cons" typer

  log "smoke test: importing sglang's server modules"
  SGLANG_USE_CPU_ENGINE=1 "$VENV/bin/python" - <<'PY'
import torch, torchvision, sgl_kernel, sglang
from sglang.srt.entrypoints import http_server  # noqa: F401
from sglang.srt.server_args import prepare_server_args  # noqa: F401
import ssr_server.engine.sglang.server  # noqa: F401
import ssr_server.cli  # noqa: F401  (ssr-server sglang-launch)
assert not hasattr(torch.ops.sgl_kernel, "convert_weight_packed"), "stub must not fake capabilities"
print(f"ok: torch {torch.__version__}, torchvision {torchvision.__version__}, sglang {sglang.__version__}")
PY
  echo "$want" >"$STAMP"
  log "venv ready in $((SECONDS - t0)) s: $VENV ($(du -sh "$VENV" | cut -f1))"
}

pidfile_for() { echo "$RUN_DIR/sglang-$1.pid"; }
logfile_for() { echo "$RUN_DIR/sglang-$1.log"; }

healthy() { curl -sf -o /dev/null --max-time 5 "http://127.0.0.1:$1/health"; }

cmd_start() {
  [[ $# -ge 2 ]] || die "usage: $0 start MODEL_DIR PORT [extra sglang flags]"
  local model="$1" port="$2"
  shift 2
  [[ -d "$model" ]] || die "model dir not found: $model"
  [[ "$port" =~ ^[0-9]+$ ]] || die "bad port: $port"
  venv_is_current || die "venv missing or stale: run '$0 venv' first"
  mkdir -p "$RUN_DIR"
  local pidfile logfile
  pidfile="$(pidfile_for "$port")"
  logfile="$(logfile_for "$port")"
  if [[ -f "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    die "a server is already running on port $port (pid $(cat "$pidfile")); '$0 stop $port' first"
  fi
  if healthy "$port"; then die "something already answers on 127.0.0.1:$port"; fi
  model="$(cd "$model" && pwd)"
  log "starting SGLang on 127.0.0.1:$port with $model (log: $logfile)"
  local t0=$SECONDS
  # --image-processor-backend pil: the same image preprocessing as transformers without torchvision
  # (the project venv). SGLang's default (torchvision, "fast") resizes differently: log-probabilities
  # then differ by up to ~4e-3 for images the processor has to resize (identical when it does not).
  # The backgrounded simple command is exec'd in the forked child, so $! is the python process itself.
  SGLANG_USE_CPU_ENGINE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 \
    nohup "$VENV/bin/python" -m ssr_server.engine.sglang.server \
    --model-path "$model" --device cpu --attention-backend torch_native --dtype float32 \
    --host 127.0.0.1 --port "$port" --max-total-tokens 8192 --skip-server-warmup \
    --image-processor-backend pil "$@" \
    >"$logfile" 2>&1 </dev/null &
  local pid=$!
  echo "$pid" >"$pidfile"
  while ! healthy "$port"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      log "server process $pid exited before becoming healthy; log tail:"
      tail -n 60 "$logfile" >&2 || true
      rm -f "$pidfile"
      exit 1
    fi
    if ((SECONDS - t0 > START_TIMEOUT)); then
      log "no /health after ${START_TIMEOUT} s; log tail:"
      tail -n 60 "$logfile" >&2 || true
      cmd_stop "$port" || true
      exit 1
    fi
    sleep 0.5
  done
  log "ready in $((SECONDS - t0)) s: http://127.0.0.1:$port (pid $pid)"
}

descendants() {
  local p
  for p in $(ps -o pid= --ppid "$1" 2>/dev/null); do
    echo "$p"
    descendants "$p"
  done
}

wait_gone() {  # wait_gone TIMEOUT PID... ; returns 1 if some are still alive
  local deadline=$((SECONDS + $1)) p alive
  shift
  while :; do
    alive=()
    for p in "$@"; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
    ((${#alive[@]} == 0)) && return 0
    ((SECONDS >= deadline)) && { echo "${alive[*]}"; return 1; }
    sleep 0.2
  done
}

cmd_stop() {
  [[ $# -eq 1 ]] || die "usage: $0 stop PORT"
  local port="$1" pidfile pid
  pidfile="$(pidfile_for "$port")"
  if [[ ! -f "$pidfile" ]]; then
    log "no pidfile for port $port: nothing to stop"
    return 0
  fi
  pid="$(cat "$pidfile")"
  if ! kill -0 "$pid" 2>/dev/null; then
    log "server pid $pid already gone"
    rm -f "$pidfile"
    return 0
  fi
  local kids
  kids="$(descendants "$pid" | tr '\n' ' ')"
  log "stopping pid $pid (children: ${kids:-none})"
  kill -TERM "$pid" 2>/dev/null || true
  local left
  # shellcheck disable=SC2086
  if ! left="$(wait_gone 20 "$pid" $kids)"; then
    log "still alive after 20 s: $left; sending SIGKILL"
    # shellcheck disable=SC2086
    kill -KILL $left 2>/dev/null || true
    # shellcheck disable=SC2086
    wait_gone 10 $left >/dev/null || die "could not stop: $left"
  fi
  rm -f "$pidfile"
  log "stopped"
}

cmd_status() {
  [[ $# -eq 1 ]] || die "usage: $0 status PORT"
  healthy "$1"
}

main() {
  local sub="${1:-}"
  [[ $# -gt 0 ]] && shift
  case "$sub" in
    venv) cmd_venv "$@" ;;
    start) cmd_start "$@" ;;
    stop) cmd_stop "$@" ;;
    status) cmd_status "$@" ;;
    hash) source_hash ;;
    *) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$SCRIPT_PATH" >&2; exit 2 ;;
  esac
}

main "$@"

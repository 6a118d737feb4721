#!/usr/bin/env bash
# SGLang's router (sglang-router from PyPI, a Rust binary in its wheel) in front of real SGLang CPU
# workers started by scripts/sglang-cpu.sh: the scale-out path of deploy/k8s, on one machine.
# Test harness only. Recipe: shared notes "real-parts-here" (router) and "sglang-on-cpu" (workers).
#
#   scripts/sglang-router.sh venv                                   build (or reuse) the router's venv
#   scripts/sglang-router.sh up MODEL_DIR PORT METRICS_PORT POLICY WORKER_PORT...
#                                 start the workers (in parallel) and the router; wait until all are healthy
#   scripts/sglang-router.sh router PORT METRICS_PORT POLICY WORKER_PORT...
#                                 start only the router, in front of workers already running
#   scripts/sglang-router.sh stop-router PORT                       stop the router
#   scripts/sglang-router.sh down PORT WORKER_PORT...               stop the router and the workers
#   scripts/sglang-router.sh kill-worker WORKER_PORT                SIGKILL a worker and its children (a lost host)
#
# POLICY: cache_aware | round_robin | manual | random | power_of_two. The router listens on 127.0.0.1:PORT and
# exports Prometheus metrics on 127.0.0.1:METRICS_PORT (per-worker request outcomes).
#
# Environment:
#   SSR_ROUTER_VENV            venv path (default: <repo>/.cache/sglang-router-venv)
#   SSR_SGLANG_PYTHON          interpreter to build the venv from (default: python3)
#   SSR_SGLANG_RUN_DIR         pidfiles and logs, shared with sglang-cpu.sh (default: /tmp/ssr-sglang)
#   SSR_ROUTER_HEALTH_INTERVAL_S  seconds between the router's health checks of each worker (default: 2)
#   SSR_ROUTER_EXTRA_ARGS      more router flags, split on spaces
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
WORKER_SCRIPT="$SCRIPT_DIR/sglang-cpu.sh"
VENV="${SSR_ROUTER_VENV:-$REPO_ROOT/.cache/sglang-router-venv}"
case "$VENV" in /*) ;; *) VENV="$REPO_ROOT/$VENV" ;; esac
BASE_PYTHON="${SSR_SGLANG_PYTHON:-python3}"
RUN_DIR="${SSR_SGLANG_RUN_DIR:-/tmp/ssr-sglang}"
HEALTH_INTERVAL="${SSR_ROUTER_HEALTH_INTERVAL_S:-2}"
ROUTER_VERSION="0.3.2"
STAMP="$VENV/.ssr-router-stamp"

log() { printf '[sglang-router] %s\n' "$*" >&2; }
die() { printf '[sglang-router] ERROR: %s\n' "$*" >&2; exit 1; }

venv_is_current() {
  [[ -f "$STAMP" && -x "$VENV/bin/python" && "$(cat "$STAMP")" == "sglang-router==$ROUTER_VERSION" ]]
}

cmd_venv() {
  mkdir -p "$RUN_DIR"
  exec 9>"$RUN_DIR/router-venv-$(echo "$VENV" | sha256sum | cut -c1-16).lock"
  flock 9  # one builder at a time; the next one finds it current
  if venv_is_current; then
    log "venv up to date: $VENV"
    return 0
  fi
  if [[ -e "$VENV" ]]; then
    [[ -f "$VENV/pyvenv.cfg" ]] || die "$VENV exists but is not a venv: not deleting it"
    rm -rf "$VENV"
  fi
  local t0=$SECONDS
  # its own venv: the router pins its own fastapi/uvicorn/pydantic, apart from the project's and SGLang's
  log "creating $VENV with sglang-router==$ROUTER_VERSION (about 20 s)"
  "$BASE_PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --progress-bar off "sglang-router==$ROUTER_VERSION"
  "$VENV/bin/python" -c "import sglang_router.launch_router"
  echo "sglang-router==$ROUTER_VERSION" >"$STAMP"
  log "venv ready in $((SECONDS - t0)) s"
}

port_ok() { [[ "$1" =~ ^[0-9]+$ ]] || die "bad port: $1"; }

ready() {  # ready PORT N: the router answers /readiness with N healthy workers
  local body
  body="$(curl -sf --max-time 3 "http://127.0.0.1:$1/readiness" 2>/dev/null)" || return 1
  [[ "$body" == *"\"healthy_workers\":$2"* ]]
}

cmd_router() {
  [[ $# -ge 4 ]] || die "usage: $0 router PORT METRICS_PORT POLICY WORKER_PORT..."
  local port="$1" mport="$2" policy="$3"
  shift 3
  port_ok "$port"
  port_ok "$mport"
  venv_is_current || die "router venv missing: run '$0 venv' first"
  mkdir -p "$RUN_DIR"
  local urls=() w
  for w in "$@"; do
    port_ok "$w"
    urls+=("http://127.0.0.1:$w")
  done
  local pidfile="$RUN_DIR/router-$port.pid" logfile="$RUN_DIR/router-$port.log"
  if [[ -f "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    die "a router already runs on port $port (pid $(cat "$pidfile"))"
  fi
  local extra=()
  # manual: every request of one routing key (ssr-server sends its conversation's) to one worker, new
  # keys to the least loaded one
  [[ "$policy" == manual ]] && extra+=(--assignment-mode min_load)
  if [[ -n "${SSR_ROUTER_EXTRA_ARGS:-}" ]]; then
    local more=()
    read -r -a more <<<"$SSR_ROUTER_EXTRA_ARGS"
    extra+=("${more[@]}")
  fi
  log "starting the router ($policy) on 127.0.0.1:$port in front of ${urls[*]} (log: $logfile)"
  # Health checks every few seconds (the default is 60 s): a dead worker refuses the connection at once
  # and leaves the rotation within about interval x failure threshold (the circuit breaker often takes
  # it out first). The timeout stays long: SGLang's /health runs a one-token generation that queues
  # behind the worker's work (a first image request takes 6-18 s on these CPUs), and a busy worker
  # marked unhealthy has its routing keys moved to the other one, away from their cached prefixes.
  nohup "$VENV/bin/python" -m sglang_router.launch_router --host 127.0.0.1 --port "$port" \
    --worker-urls "${urls[@]}" --policy "$policy" \
    --prometheus-host 127.0.0.1 --prometheus-port "$mport" \
    --health-check-interval-secs "$HEALTH_INTERVAL" --health-failure-threshold 2 \
    --health-success-threshold 1 --health-check-timeout-secs 20 \
    --log-level warn "${extra[@]}" >"$logfile" 2>&1 </dev/null &
  local pid=$! t0=$SECONDS
  echo "$pid" >"$pidfile"
  while ! ready "$port" "$#"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 40 "$logfile" >&2 || true
      rm -f "$pidfile"
      die "the router exited before it was ready"
    fi
    if ((SECONDS - t0 > 60)); then
      tail -n 40 "$logfile" >&2 || true
      cmd_stop_router "$port"
      die "the router did not report $# healthy workers in 60 s"
    fi
    sleep 0.3
  done
  log "router ready in $((SECONDS - t0)) s: http://127.0.0.1:$port (pid $pid, $# workers)"
}

cmd_stop_router() {
  [[ $# -eq 1 ]] || die "usage: $0 stop-router PORT"
  local pidfile="$RUN_DIR/router-$1.pid" pid
  [[ -f "$pidfile" ]] || return 0
  pid="$(cat "$pidfile")"
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    local i
    for i in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
  log "router on port $1 stopped"
}

cmd_up() {
  [[ $# -ge 5 ]] || die "usage: $0 up MODEL_DIR PORT METRICS_PORT POLICY WORKER_PORT..."
  local model="$1" port="$2" mport="$3" policy="$4"
  shift 4
  local w pids=() failed=0
  # Workers start in parallel, sharing the cores: on 2 busy cores two took 80-180 s, hence the longer
  # wait for /health than sglang-cpu.sh's own default (180 s).
  for w in "$@"; do
    SSR_SGLANG_START_TIMEOUT="${SSR_SGLANG_START_TIMEOUT:-420}" bash "$WORKER_SCRIPT" start "$model" "$w" &
    pids+=($!)
  done
  for w in "${pids[@]}"; do wait "$w" || failed=1; done
  if ((failed)); then
    for w in "$@"; do bash "$WORKER_SCRIPT" stop "$w" || true; done
    die "a worker did not start"
  fi
  cmd_router "$port" "$mport" "$policy" "$@"
}

cmd_down() {
  [[ $# -ge 1 ]] || die "usage: $0 down PORT WORKER_PORT..."
  cmd_stop_router "$1"
  shift
  local w
  for w in "$@"; do bash "$WORKER_SCRIPT" stop "$w" & done
  wait
}

descendants() {
  local p
  for p in $(ps -o pid= --ppid "$1" 2>/dev/null); do
    echo "$p"
    descendants "$p"
  done
}

cmd_kill_worker() {
  [[ $# -eq 1 ]] || die "usage: $0 kill-worker WORKER_PORT"
  local pidfile="$RUN_DIR/sglang-$1.pid" pid
  [[ -f "$pidfile" ]] || die "no worker on port $1"
  pid="$(cat "$pidfile")"
  local all
  all="$pid $(descendants "$pid" | tr '\n' ' ')"
  # the whole process tree at once, as when its host is lost: no graceful shutdown anywhere
  # shellcheck disable=SC2086
  kill -KILL $all 2>/dev/null || true
  rm -f "$pidfile"
  log "SIGKILLed the worker on port $1 (pids $all)"
}

main() {
  local sub="${1:-}"
  [[ $# -gt 0 ]] && shift
  case "$sub" in
    venv) cmd_venv "$@" ;;
    up) cmd_up "$@" ;;
    router) cmd_router "$@" ;;
    stop-router) cmd_stop_router "$@" ;;
    down) cmd_down "$@" ;;
    kill-worker) cmd_kill_worker "$@" ;;
    *) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2; exit 2 ;;
  esac
}

main "$@"

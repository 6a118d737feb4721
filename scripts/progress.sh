# Sourced by the set-up scripts: run a slow step with a visible progress line.
#   progress_step LABEL CMD [ARGS...]
# prints "LABEL ..." at the start, "LABEL ... still running (N s)" every PROGRESS_EVERY seconds (default 15)
# and "LABEL: done in N s" at the end; the step's exit status is returned unchanged.
progress_step() {
  local label=$1
  shift
  local t0=$SECONDS every=${PROGRESS_EVERY:-15} ticks=0 pid rc=0
  printf '%s ...\n' "$label" >&2
  "$@" &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    ticks=$((ticks + 1))
    if [ $((ticks % every)) -eq 0 ] && kill -0 "$pid" 2>/dev/null; then
      printf '%s ... still running (%d s)\n' "$label" $((SECONDS - t0)) >&2
    fi
  done
  wait "$pid" || rc=$?
  if [ "$rc" -eq 0 ]; then
    printf '%s: done in %d s\n' "$label" $((SECONDS - t0)) >&2
  else
    printf '%s: FAILED (exit %d) after %d s\n' "$label" "$rc" $((SECONDS - t0)) >&2
  fi
  return "$rc"
}

#!/usr/bin/env bash
# The main job: set up, start the agent server on the embedded default (the shipped trained model),
# wait until it is ready, and ask it the demo world's headline question about its picture.
# The server keeps serving afterwards (Ctrl-C stops it); DEMO_ONCE=1 stops it after the answer and exits
# 0 when the run answered, non-zero when anything failed (set-up, start-up, the request, no answer).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PORT=${SSR_PORT:-8000}
URL="http://127.0.0.1:$PORT"
.venv/bin/ssr-server serve --host 127.0.0.1 --port "$PORT" &
SERVER=$!
# Keep the script's own exit status: the server, killed here, exits 143, and a bare `wait` on it in the
# trap would replace the demo's status (and, under set -e, end the trap early).
cleanup() {
  local rc=$?
  kill "$SERVER" 2>/dev/null || true
  wait "$SERVER" 2>/dev/null || true
  exit "$rc"
}
trap cleanup EXIT
for _ in $(seq 1 300); do
  curl -sf "$URL/ready" >/dev/null 2>&1 && break
  kill -0 $SERVER 2>/dev/null || { echo "demo: the server exited during start-up" >&2; exit 1; }
  sleep 0.5
done
# The demo world's headline question: a landmark's height from its picture alone (image search, then
# text search). The server searches the same demo world, shipped in the package.
IMG=$(mktemp --suffix=.jpg)
GOLD=$(mktemp)
QUESTION=$(.venv/bin/python - "$IMG" "$GOLD" <<'PY'
import shutil, sys
from ssr_server.tools.demo import shipped_demo_world, showcase_question
world = shipped_demo_world()
question = showcase_question(world.questions())
shutil.copy(world.root / question.image, sys.argv[1])
with open(sys.argv[2], "w") as f:
    f.write("".join(a + "\n" for a in [question.answer, *question.aliases]))
print(question.question)
PY
)
GOLD_ARGS=()
while IFS= read -r answer; do GOLD_ARGS+=(--gold "$answer"); done < "$GOLD"
echo "demo: asking $URL \"$QUESTION\" about $IMG" >&2
.venv/bin/ssr-server ask --server "$URL" --image "$IMG" --question "$QUESTION" --max-turns 4 --expect-answer \
  "${GOLD_ARGS[@]}" ${DEMO_EXPECT_CORRECT:+--expect-correct}
rm -f "$GOLD"
rm -f "$IMG"
if [ "${DEMO_ONCE:-0}" = "1" ]; then exit 0; fi
echo "demo: serving on $URL (Ctrl-C to stop). Try: curl -s $URL/v1/libraries" >&2
wait $SERVER

#!/usr/bin/env bash
# Idempotent set-up of the project's venv (.venv): the CPU torch wheel first, then the project.
# `pip install torch==2.13.0` takes the CPU build (on these machines, from local disk); installing the
# project first would let a resolver pick a multi-GB CUDA build. About 2 minutes the first time.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/progress.sh
. scripts/progress.sh
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
VENV=${SSR_VENV:-.venv}
stamp="$VENV/.ssr-setup-stamp"
want=$(cat pyproject.toml setup.py scripts/setup.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
t0=$SECONDS
echo "setup: creating $VENV with $($PY --version)" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install -q --progress-bar off)
progress_step "setup: [1/3] pip itself" "${pip[@]}" --upgrade pip
# Elsewhere set TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu to get the CPU build from PyTorch.
progress_step "setup: [2/3] torch==2.13.0 (the CPU wheel)" \
  "${pip[@]}" "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
progress_step "setup: [3/3] the project and its dev/loadtest extras (about 2 min the first time)" \
  "${pip[@]}" -e ".[dev,loadtest]"
echo "$want" > "$stamp"
echo "setup: $VENV ready in $((SECONDS - t0)) s" >&2

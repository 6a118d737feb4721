#!/usr/bin/env bash
# Idempotent set-up of the project's venv (.venv): the CPU torch wheel first, then the project.
# `pip install torch==2.13.0` takes the CPU build (on these machines, from local disk); installing the
# project first would let a resolver pick a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
VENV=${SSR_VENV:-.venv}
stamp="$VENV/.ssr-setup-stamp"
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "setup: creating $VENV with $($PY --version)" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# Elsewhere set TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu to get the CPU build from PyTorch.
"$VENV/bin/python" -m pip install -q "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
"$VENV/bin/python" -m pip install -q -e ".[dev,loadtest]"
echo "$want" > "$stamp"
echo "setup: done" >&2

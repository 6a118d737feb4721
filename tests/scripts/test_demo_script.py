"""The README's main command, run as a newcomer would: ``DEMO_ONCE=1 bash scripts/demo.sh``.

It must exit 0 after an answered question and non-zero when the demo fails (issue 10: the EXIT trap
used to replace the status with the killed server's 143). The project venv is already set up by the
test command, so the script's set-up step is a no-op here.
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _demo(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "DEMO_ONCE": "1", "SSR_PORT": str(free_port()),
            "SSR_CACHE_DIR": str(tmp_path / "cache"), "SSR_TORCH_THREADS": "1", **env}
    return subprocess.run(["bash", "scripts/demo.sh"], cwd=REPO, env=full, capture_output=True, text=True,
                          timeout=900)


@pytest.mark.slow
def test_demo_answers_and_exits_zero(tmp_path: Path) -> None:
    proc = _demo(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "outcome: answered" in proc.stdout, proc.stdout[-3000:]


def test_demo_fails_loudly_when_the_server_cannot_start(tmp_path: Path) -> None:
    proc = _demo(tmp_path, SSR_MODEL=str(tmp_path / "no-such-model"))
    assert proc.returncode != 0
    assert "the server exited during start-up" in proc.stderr, proc.stderr[-3000:]

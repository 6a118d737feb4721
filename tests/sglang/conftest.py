"""A real SGLang server (CPU harness, scripts/sglang-cpu.sh) serving the tiny Qwen3-VL, for the session.

The first run builds SGLang's own venv (about 90 s; cached by a hash of the script and stub sources),
then each session builds the tiny model (a few seconds) and starts the server (about 25 s).
Set SSR_SGLANG_TESTS=0 to skip these tests; SSR_SGLANG_VENV picks another venv.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "sglang-cpu.sh"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("SSR_SGLANG_TESTS", "1") != "0":
        return
    here = Path(__file__).parent
    for item in items:  # this hook sees the whole session's items: only skip ours
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.skip(reason="SSR_SGLANG_TESTS=0"))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _script(*args: str, timeout: float) -> None:
    t0 = time.perf_counter()
    proc = subprocess.run(
        ["bash", str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )
    sys.stderr.write(proc.stderr[-4000:])
    if proc.returncode != 0:
        pytest.fail(
            f"scripts/sglang-cpu.sh {' '.join(args)} failed (rc {proc.returncode}) after "
            f"{time.perf_counter() - t0:.0f} s:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ssr_server.engine.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("sglang-tiny"), seed=0, vocab="trained")


@pytest.fixture(scope="session")
def sglang_url(tiny_model_dir: Path) -> Iterator[str]:
    """Base URL of a running SGLang server with /ssr/score, on a free 127.0.0.1 port."""
    _script("venv", timeout=1800)  # cached: a no-op when the venv is current
    port = _free_port()
    _script("start", str(tiny_model_dir), str(port), timeout=300)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        _script("stop", str(port), timeout=120)

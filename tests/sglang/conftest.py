"""A real SGLang server (CPU harness, scripts/sglang-cpu.sh) serving the tiny Qwen3-VL, for the session.

The first run builds SGLang's own venv (70-150 s on these machines; cached by a hash of the script
and stub sources), then each session builds the tiny model (a few seconds) and starts the server (about 25 s).
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


@pytest.fixture(scope="session")
def agent_url(
    sglang_url: str, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A real ``ssr-server serve --engine sglang`` process in front of the SGLang server."""
    import httpx

    port = _free_port()
    env = {**os.environ, "SSR_CACHE_DIR": str(tmp_path_factory.mktemp("agent-cache")),
           "SSR_SGLANG_TIMEOUT_S": "60", "HF_HUB_OFFLINE": "1"}
    exe = Path(sys.executable).with_name("ssr-server")
    proc = subprocess.Popen(
        [str(exe), "serve", "--engine", "sglang", "--model", str(tiny_model_dir), "--sglang-url", sglang_url,
         "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        env=env, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"ssr-server serve exited with {proc.returncode}", pytrace=False)
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        else:
            pytest.fail("ssr-server serve did not start in 120 s", pytrace=False)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


class SGLangControl:
    """Stops and starts the session's SGLang server on its port (fault tests leave it running)."""

    def __init__(self, model_dir: Path, url: str) -> None:
        self.model_dir, self.port = model_dir, url.rsplit(":", 1)[1]

    def stop(self) -> None:
        _script("stop", self.port, timeout=120)

    def start(self) -> None:
        _script("start", str(self.model_dir), self.port, timeout=300)


@pytest.fixture(scope="session")
def sglang_control(sglang_url: str, tiny_model_dir: Path) -> SGLangControl:
    return SGLangControl(tiny_model_dir, sglang_url)

"""SGLang's server (with our /ssr/score route) as a child process for the check."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from ssr_server.bench.gpu_check.common import (
    EXIT_FAILED,
    EXIT_NO_SGLANG,
    HEALTH_TIMEOUT_S,
    MEM_FRACTION_STATIC,
    CheckError,
)

# ---------------------------------------------------------------------------------------------- SGLang


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_command(model_dir: str | os.PathLike[str], port: int | str, *, python: str | None = None,
                   mem_fraction: float = MEM_FRACTION_STATIC, extra_args: Sequence[str] = ()) -> list[str]:
    return [python or sys.executable, "-m", "ssr_server.engine.sglang.server", "--model-path", str(model_dir),
            "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16",
            "--mem-fraction-static", f"{mem_fraction:g}", *extra_args]


def _child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the SGLang interpreter: offline, and this project importable without install."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": f"{root}{os.pathsep}{path}" if path else root, **(extra or {})}


def check_sglang(python: str | None = None) -> str:
    """SGLang's version as the server's interpreter imports it (with our route module); CheckError if not."""
    exe = python or sys.executable
    code = "import sglang, ssr_server.engine.sglang.server; print(sglang.__version__)"
    try:
        proc = subprocess.run([exe, "-c", code], capture_output=True, text=True, timeout=300,
                              env=_child_env())
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CheckError(EXIT_NO_SGLANG, f"cannot run {exe} to import sglang: {e}") from None
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise CheckError(EXIT_NO_SGLANG, (
            f"`import sglang` failed in {exe}:\n{tail}\n"
            "The sglang engine needs SGLang's GPU install in this environment (e.g. the lmsysorg/sglang "
            "image, with this project installed by `pip install --no-deps -e .`), or --sglang-python "
            "pointing at an interpreter that has both; or use --engine torch."))
    return proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "?"


def _log_tail(path: Path, lines: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _stop_group(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    """Stop the server we started: SIGTERM to its process group (its PID: it leads a new session, so
    the group holds only it and its children), then SIGKILL after ``timeout_s``."""
    pgid = proc.pid
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 15.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(0.2)
            try:
                os.killpg(pgid, 0)  # anyone left in the group (the scheduler, the detokenizer)?
            except ProcessLookupError:
                return
            time.sleep(0.2)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


@contextlib.contextmanager
def sglang_server(model_dir: Path, port: int, log_path: Path, *, python: str | None = None,
                  mem_fraction: float = MEM_FRACTION_STATIC, extra_args: Sequence[str] = (),
                  env: dict[str, str] | None = None, timeout_s: float = HEALTH_TIMEOUT_S,
                  log: Callable[[str], None] = print) -> Iterator[str]:
    """Start SGLang (with /ssr/score) on 127.0.0.1:port, wait for /health, yield its URL; always stop it."""
    import httpx

    cmd = server_command(model_dir, port, python=python, mem_fraction=mem_fraction, extra_args=extra_args)
    full_env = _child_env(env)
    log(f"  starting SGLang: {' '.join(cmd)}")
    log(f"  server log: {log_path}")
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=full_env, start_new_session=True)
    try:
        t0 = time.monotonic()
        with httpx.Client(trust_env=False, timeout=5.0) as client:
            while True:
                if proc.poll() is not None:
                    raise CheckError(EXIT_FAILED, f"SGLang exited with {proc.returncode} before /health; "
                                                  f"log tail ({log_path}):\n{_log_tail(log_path)}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(url + "/health").status_code == 200:
                        break
                if time.monotonic() - t0 > timeout_s:
                    raise CheckError(EXIT_FAILED, f"SGLang did not answer /health in {timeout_s:.0f} s; "
                                                  f"log tail ({log_path}):\n{_log_tail(log_path)}")
                time.sleep(1.0)
        log(f"  SGLang ready in {time.monotonic() - t0:.0f} s (pid {proc.pid})")
        yield url
    finally:
        _stop_group(proc)
        log(f"  SGLang stopped (pid {proc.pid})")

"""Runs outlive their server: a real ``ssr-server serve`` process SIGKILLed mid-run comes back with the run
``interrupted`` and every finished turn intact; a background run still going at the shutdown drain's
deadline is cancelled and recorded as ``interrupted``; a drain waits for background runs that finish."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

START_S = 180.0


@contextlib.contextmanager
def serve_process(tiny_model_dir: Path, env: dict[str, str], log: Path) -> Iterator[tuple[str, Any]]:
    """``ssr-server serve`` in a process of its own on a free port; killed at the end whatever happens."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    cmd = [sys.executable, "-m", "ssr_server.cli", "serve", "--model", str(tiny_model_dir), "--host",
           "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    with log.open("ab") as out:
        popen = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_S
        while True:
            if popen.poll() is not None:
                pytest.fail(f"the server exited during start-up\n{log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/ready", timeout=5).status_code == 200:
                    break
            if time.monotonic() > deadline:
                pytest.fail(f"the server was not ready in {START_S:g} s\n{log.read_text()[-3000:]}")
            time.sleep(0.1)
        yield url, popen
    finally:
        if popen.poll() is None:
            popen.kill()
        popen.wait(30)


def test_a_sigkilled_run_comes_back_interrupted_with_its_finished_turns(
        tiny_model_dir: Path, library_dir: Path, tmp_path: Path, kit: Any, stored: Any) -> None:
    search = kit.GatedSearch(free=2)  # two turns finish; the third waits in its search when killed
    env = {**os.environ, "SSR_RUN_STORE": f"sqlite:///{tmp_path / 'runs.sqlite3'}",
           "SSR_CACHE_DIR": str(tmp_path / "cache"), "SSR_TORCH_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "SSR_SEARXNG_URL": search.url,
           "SSR_LIBRARY_DIRS": json.dumps([str(library_dir)]), "SSR_TOOL_TIMEOUT_S": "120"}
    log = tmp_path / "serve.log"
    try:
        with serve_process(tiny_model_dir, env, log) as (url, popen):
            run_id = httpx.post(f"{url}/v1/agent/runs", json={**kit.GATED, "background": True},
                                timeout=60).json()["id"]
            before = kit.wait_for(lambda: (r := kit.get_run(url, run_id))["turn_count"] >= 2 and r,
                                  what="two finished turns")
            kit.wait_for(lambda: search.hits >= 3, what="the third turn's search")
            popen.send_signal(signal.SIGKILL)
            popen.wait(30)
        assert before["status"] == "running"
        # the restart: a server on the same store (in this process, to spare a second model load)
        with stored(env["SSR_RUN_STORE"], search) as url:
            after = kit.get_run(url, run_id)
    finally:
        search.close()
    assert after["status"] == "interrupted" and after["finished_at"] is not None
    assert "stopped" in after["error"]
    assert after["turns"] == before["turns"][:2] and after["turn_count"] == 2
    assert [t["action_type"] for t in after["turns"]] == ["text_search", "text_search"]


def test_the_drain_interrupts_a_background_run_past_its_deadline(stored: Any, sqlite_url: str,
                                                                search: Any, kit: Any) -> None:
    with stored(sqlite_url, search, drain_timeout_s=0.5) as url:
        run_id = httpx.post(f"{url}/v1/agent/runs", json={**kit.GATED, "background": True},
                            timeout=60).json()["id"]
        kit.wait_for(lambda: kit.get_run(url, run_id)["turn_count"] >= 1, what="a turn")
    # stopped (its drain cut the run); a new server reads the run back from the store
    search.open()
    with stored(sqlite_url, search) as url:
        run = kit.get_run(url, run_id)
    assert run["status"] == "interrupted" and run["turn_count"] == 1 == len(run["turns"])


def test_the_drain_waits_for_a_background_run_that_finishes(stored: Any, sqlite_url: str, search: Any,
                                                           kit: Any) -> None:
    import threading

    with stored(sqlite_url, search, drain_timeout_s=30) as url:
        run_id = httpx.post(f"{url}/v1/agent/runs", json={**kit.GATED, "background": True,
                                                          "max_turns": 2}, timeout=60).json()["id"]
        kit.wait_for(lambda: kit.get_run(url, run_id)["turn_count"] >= 1, what="a turn")
        threading.Timer(1.0, search.open).start()  # the held search answers once the drain has begun
    with stored(sqlite_url, search) as url:
        run = kit.get_run(url, run_id)
    assert run["status"] == "completed" and run["turn_count"] == 2

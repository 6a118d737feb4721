"""Two real SGLang CPU workers behind SGLang's real router, driven through ``scripts/sglang-router.sh``
(a checkout's harness: the router from PyPI in its own venv, the workers from ``scripts/sglang-cpu.sh``).
Used by ``ssr-server bench router`` and by ``tests/router``."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
ROUTER_SCRIPT = REPO / "scripts" / "sglang-router.sh"
WORKER_SCRIPT = REPO / "scripts" / "sglang-cpu.sh"


class HarnessError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def script(path: Path, *args: str, timeout: float) -> None:
    """One harness command; its log lines go to stderr, a failure raises with the tail of its output."""
    if not path.is_file():
        raise HarnessError(f"{path} not found: the router harness runs from a checkout of ssr-server")
    proc = subprocess.run(["bash", str(path), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)
    sys.stderr.write(proc.stderr[-3000:])
    if proc.returncode != 0:
        raise HarnessError(f"{path.name} {' '.join(args)} failed (rc {proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


@dataclass
class RouterHarness:
    """Ports of one router (and its metrics) and its workers on 127.0.0.1; ``up`` starts them all."""

    model: str
    workers: list[int] = field(default_factory=lambda: [free_port(), free_port()])
    port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    policy: str = "cache_aware"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def worker_url(self, port: int) -> str:
        return f"http://127.0.0.1:{port}"

    def venvs(self) -> None:
        script(WORKER_SCRIPT, "venv", timeout=1800)  # both cached: no-ops when current
        script(ROUTER_SCRIPT, "venv", timeout=600)

    def up(self) -> None:
        script(ROUTER_SCRIPT, "up", self.model, str(self.port), str(self.metrics_port), self.policy,
               *map(str, self.workers), timeout=600)

    def restart_router(self, policy: str) -> None:
        script(ROUTER_SCRIPT, "stop-router", str(self.port), timeout=60)
        self.policy = policy
        script(ROUTER_SCRIPT, "router", str(self.port), str(self.metrics_port), policy,
               *map(str, self.workers), timeout=120)

    def kill_worker(self, port: int) -> None:
        script(ROUTER_SCRIPT, "kill-worker", str(port), timeout=60)

    def down(self) -> None:
        script(ROUTER_SCRIPT, "down", str(self.port), *map(str, self.workers), timeout=300)

    def flush_workers(self) -> None:
        """Empty every live worker's radix cache (each level starts cold), straight at the workers. Without
        ``?timeout=``: with it, a busy worker flushes later, when it next goes idle, which can be between
        two steps of the next level's runs."""
        for port in self.workers:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    resp = httpx.post(self.worker_url(port) + "/flush_cache", timeout=10, trust_env=False)
                except httpx.HTTPError:
                    break  # a killed worker
                if resp.status_code == 200:
                    break
                time.sleep(0.2)

    def healthy_workers(self) -> int:
        """What the router reports on ``/readiness`` (0 when it answers nothing)."""
        try:
            body = httpx.get(self.url + "/readiness", timeout=3, trust_env=False).json()
        except (httpx.HTTPError, ValueError):
            return 0
        return int(body.get("healthy_workers", 0)) if isinstance(body, dict) else 0

    def wait_healthy(self, n: int, timeout_s: float) -> float | None:
        """Seconds until the router reports ``n`` healthy workers; None if it did not within the bound."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self.healthy_workers() == n:
                return time.monotonic() - t0
            time.sleep(0.2)
        return None

    def requests_by_worker(self) -> dict[int, int]:
        """Requests the router sent to each worker so far, answered or failed (its Prometheus counters)."""
        text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5, trust_env=False).text
        out = {p: 0 for p in self.workers}
        for line in text.splitlines():
            if line.startswith("smg_worker_cb_outcomes_total{"):
                labels, value = line.rsplit(" ", 1)
                for p in self.workers:
                    if f'worker="{self.worker_url(p)}"' in labels:
                        out[p] += int(float(value))
        return out

"""Locust users for ``POST /v1/agent/runs``: a mix of modes, demo questions and demo images.

Run headless, bounded in users and time (see loadtest/README.md)::

    locust -f loadtest/locustfile.py --headless -u 8 -r 2 -t 60s --host http://127.0.0.1:8000

Environment knobs:

* ``SSR_LOADTEST_MIX``: mode weights, default ``ssr=0.5,freeform=0.5``;
* ``SSR_LOADTEST_IMAGES``: fraction of requests carrying a demo image, default ``1.0``;
* ``SSR_LOADTEST_MAX_TURNS`` (default 4), ``SSR_LOADTEST_TAU`` (default 1.0),
  ``SSR_LOADTEST_REASONING_BUDGET`` (freeform reasoning tokens per turn, default: the server's);
* ``SSR_API_KEY``: sent as ``Authorization: Bearer ...``;
* ``SSR_LOADTEST_ALLOW_REMOTE=1``: allow a non-loopback host (refused by default).

Each run is reported under ``runs [<mode>]``; a 429/503 fails as ``refused`` (Retry-After in the
message). Each turn's server-side reasoning time is also reported, as request type ``TURN`` named
``reasoning [<mode>]``, and the run's model time per question as ``MODEL`` ``model [<mode>]``, so
Locust's percentile tables show them next to the run latency.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
from typing import Any

from locust import HttpUser, between, events, task
from locust.exception import StopUser

from ssr_server.loadtest import Workload, is_loopback, parse_mix

log = logging.getLogger("ssr-loadtest")
DEFAULT_HOST = "http://127.0.0.1:8000"

_extra: dict[str, Any] = {}
if os.environ.get("SSR_LOADTEST_REASONING_BUDGET"):
    _extra["reasoning_budget"] = int(os.environ["SSR_LOADTEST_REASONING_BUDGET"])
WORKLOAD = Workload(
    parse_mix(os.environ.get("SSR_LOADTEST_MIX", "ssr=0.5,freeform=0.5")),
    with_images=float(os.environ.get("SSR_LOADTEST_IMAGES", "1.0")),
    max_turns=int(os.environ.get("SSR_LOADTEST_MAX_TURNS", "4")),
    seed=int(os.environ.get("SSR_LOADTEST_SEED", "0")),
    tau=float(os.environ.get("SSR_LOADTEST_TAU", "1.0")),
    extra=_extra,
)
ALLOW_REMOTE = os.environ.get("SSR_LOADTEST_ALLOW_REMOTE", "") == "1"
_counter = itertools.count(random.Random().randrange(1 << 20))  # distinct requests across users


def _host_ok(host: str | None) -> bool:
    return ALLOW_REMOTE or is_loopback(host or DEFAULT_HOST)


@events.test_start.add_listener
def _refuse_remote(environment: Any, **_: Any) -> None:
    host = environment.host or AgentUser.host
    if not _host_ok(host):
        log.error("refusing to load %s: loopback hosts only (SSR_LOADTEST_ALLOW_REMOTE=1 overrides)", host)
        environment.process_exit_code = 1
        if environment.runner is not None:
            environment.runner.quit()


class AgentUser(HttpUser):
    """One client: sends a run, waits for it, pauses briefly, repeats."""

    host = DEFAULT_HOST
    wait_time = between(0.1, 0.5)

    def on_start(self) -> None:
        if not _host_ok(self.host):
            raise StopUser()
        key = os.environ.get("SSR_API_KEY")
        if key:
            self.client.headers["Authorization"] = f"Bearer {key}"
        self.client.trust_env = False  # never send loopback load through a proxy

    @task
    def agent_run(self) -> None:
        req = WORKLOAD.request(next(_counter))
        name = f"runs [{req.mode}]"
        with self.client.post("/v1/agent/runs", json=req.body, name=name, catch_response=True,
                              timeout=600) as resp:
            if resp.status_code in (429, 503):
                resp.failure(f"refused {resp.status_code} (Retry-After {resp.headers.get('Retry-After')})")
                return
            if resp.status_code != 200:
                resp.failure(f"{resp.status_code}: {resp.text[:200]}")
                return
            try:
                run = resp.json()
            except ValueError:
                resp.failure("response is not JSON")
                return
            if run.get("outcome") not in ("answered", "max_turns"):
                resp.failure(f"outcome {run.get('outcome')}: {run.get('error')}")
            else:
                resp.success()
        for turn in run.get("turns", []):
            events.request.fire(request_type="TURN", name=f"reasoning [{req.mode}]",
                                response_time=float(turn["reasoning_s"]) * 1e3, response_length=0,
                                exception=None, context={})
        model_s = (run.get("timings") or {}).get("model_s")
        if model_s is not None:
            events.request.fire(request_type="MODEL", name=f"model [{req.mode}]",
                                response_time=float(model_s) * 1e3, response_length=0, exception=None,
                                context={})

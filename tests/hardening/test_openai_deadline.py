"""A chat completion that passes the server's run deadline is a 504 in OpenAI's error shape, counted as a
``timeout`` run, never a 500 (it was an internal error before the completer kept the deadline)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ssr_server.core.config import Settings


@pytest.fixture(scope="module")
def live(serve: Any) -> Iterator[Any]:
    # one token per decode forward: with drafts, the random model's loops are drafted 8 tokens a forward
    # and 2,048 tokens took 0.44 s once, inside a 0.5 s deadline
    with serve(Settings(run_deadline_s=0.2, speculative_tokens=0)) as live:
        yield live


def test_a_completion_past_the_deadline_is_a_504_counted_as_a_timeout(live: Any, read_metric: Any,
                                                                       poll: Any) -> None:
    before = read_metric(live.url, "ssr_runs_total", outcome="timeout")
    with httpx.Client(base_url=live.url, timeout=60) as client:
        model = client.get("/v1/models").json()["data"][0]["id"]
        # 2,048 freeform reasoning tokens are 2,048 forwards: seconds here (~1.5 ms each at the least)
        body = {"model": model, "messages": [{"role": "user", "content": "What is in the picture?"}],
                "ssr": {"mode": "freeform", "reasoning_budget": 2048}}
        r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 504, r.text
    error = r.json()["error"]
    assert error["code"] == "deadline_exceeded" and error["type"] == "server_error", error
    assert poll(lambda: read_metric(live.url, "ssr_runs_total", outcome="timeout") == before + 1, 10)
    assert poll(lambda: read_metric(live.url, "ssr_runs_in_flight") == 0, 10)

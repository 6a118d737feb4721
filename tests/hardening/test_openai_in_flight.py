"""A chat completion is counted like a run: ``ssr_runs_in_flight`` while it is served (it stayed at 0
during a 20 s chat while ``/ready`` said 1), then ``ssr_runs_total`` by mode and outcome, the run
seconds, model seconds and turns histograms, exactly as the agent endpoint counts a run.

The completion is held inside the engine (its selection waits for the test), so the test reads the
metrics while it is certainly in flight, however fast the machine.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import httpx
import pytest

from ssr_server.core.config import Settings
from ssr_server.core.protocol import Context


class Held:
    """The session's engine, whose next selection, once armed, waits until the test releases it."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.armed, self.holding, self.release = threading.Event(), threading.Event(), threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def score(self, context: Context, candidates: Sequence[Sequence[int]]) -> list[Any]:
        if self.armed.is_set():
            self.armed.clear()
            self.holding.set()
            await asyncio.to_thread(self.release.wait, 60)
        return list(await self._engine.score(context, candidates))


@pytest.fixture(scope="module")
def held(torch_engine: Any) -> Held:
    return Held(torch_engine)


@pytest.fixture(scope="module")
def url(held: Held, demo_tools: Any) -> Iterator[str]:
    from ssr_server.bench.serve import live_server

    with live_server(Settings(), held, demo_tools) as url:
        try:
            yield url
        finally:
            held.release.set()  # nothing may stay held past the module: the server must stop


@pytest.mark.parametrize("stream", [False, True])
def test_a_held_chat_completion_is_in_flight(url: str, held: Held, stream: bool,
                                             read_metric: Callable[..., float],
                                             poll: Callable[[Callable[[], bool], float], bool]) -> None:
    def metric(name: str, **labels: str) -> float:
        return read_metric(url, name, **labels)

    names = ("ssr_run_seconds_count", "ssr_run_model_seconds_count", "ssr_run_turns_count",
             "ssr_run_turns_sum")
    before = {n: metric(n, mode="ssr") for n in names}
    finished = {o: metric("ssr_runs_total", mode="ssr", outcome=o) for o in ("answered", "tool_calls")}
    idle = metric("ssr_runs_in_flight")
    held.release.clear()
    held.armed.set()
    answer: dict[str, httpx.Response] = {}
    body = {"model": "ssr-tiny", "messages": [{"role": "user", "content": "Is it raining in Lyon?"}],
            "max_tokens": 8, "stream": stream}
    client = threading.Thread(target=lambda: answer.update(
        r=httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)))
    client.start()
    try:
        assert held.holding.wait(60), "the completion never reached the engine"
        assert metric("ssr_runs_in_flight") == idle + 1
        assert httpx.get(f"{url}/ready", timeout=10).json()["runs_in_flight"] == 1
    finally:
        held.release.set()
        client.join(120)
    assert answer["r"].status_code == 200, answer["r"].text
    held.holding.clear()
    assert poll(lambda: metric("ssr_runs_in_flight") == idle, 10)
    after = {o: metric("ssr_runs_total", mode="ssr", outcome=o) for o in finished}
    assert sum(after.values()) == sum(finished.values()) + 1
    for n in names:
        assert metric(n, mode="ssr") == before[n] + 1, n

"""Moves that need an image are not offered when there is none. The attack as found: a run with no
image could still choose zoom, and the model was told "images 0 to -1 are available". On the OpenAI
route, a tool set that holds our image tools and a conversation without an image behave as the agent
loop does: the rationales whose move needs an image are left out of the selection (the response's
``ssr.left_out`` says so), no image tool is ever called, and a request that forces one is a 400.

"Whatever the model prefers": the server's engine is steered towards the image moves (their rationales
and their calls' openings made overwhelmingly likely whenever they are scored); with an image it takes
them, without one it is never offered them."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import pytest

from ssr_server.agent.loop import Agent
from ssr_server.core.config import Settings
from ssr_server.core.formats.format import get_format
from ssr_server.core.library import LibraryRegistry
from ssr_server.core.protocol import Context

OUR_TOOLS: list[dict[str, Any]] = [json.loads(json.dumps(t)) for t in get_format().tools]
IMAGE_TOOLS = {"image_search_tool", "image_zoom_in_tool"}
DEFAULT = LibraryRegistry().get("default")
IMAGE_CANDIDATES = {c.id for c in DEFAULT.candidates if c.action in ("zoom", "image_search")}


class PreferImageMoves:
    """The session's engine, with the image moves' rationales and call openings made overwhelmingly
    likely whenever they are scored."""

    def __init__(self, engine: Any, demo_tools: Any) -> None:
        self._engine = engine
        probe = Agent(engine, demo_tools, LibraryRegistry())
        ids = probe.candidate_ids(DEFAULT)
        openings = [probe.format.action_opening(a) for a in ("zoom", "image_search")]
        chosen = [i for i, c in enumerate(DEFAULT.candidates) if c.id in IMAGE_CANDIDATES]
        self._preferred = {tuple(ids[i]) for i in chosen}
        self._preferred |= {probe.chat.encode(o) for o in openings}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def score(self, context: Context, candidates: Sequence[Sequence[int]]) -> list[Any]:
        scores = await self._engine.score(context, candidates)
        return [dataclasses.replace(s, token_logprobs=tuple(lp + 100.0 for lp in s.token_logprobs))
                if tuple(c) in self._preferred else s for s, c in zip(scores, candidates, strict=True)]


@pytest.fixture(scope="module")
def url(torch_engine: Any, demo_tools: Any) -> Iterator[str]:
    from ssr_server.bench.serve import live_server

    with live_server(Settings(), PreferImageMoves(torch_engine, demo_tools), demo_tools) as url:
        yield url


def chat(url: str, **extra: Any) -> httpx.Response:
    body = {"model": "ssr-tiny", "messages": [{"role": "user", "content": "What does the sign say?"}],
            "tools": OUR_TOOLS, "max_tokens": 48, **extra}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)


@pytest.mark.parametrize("mode", ["ssr", "freeform"])
def test_no_image_tool_is_called_without_an_image(url: str, mode: str) -> None:
    called = set()
    for seed in range(4):
        r = chat(url, tool_choice="required", seed=seed,
                 ssr={"mode": mode, "tau": 5.0, "reasoning_budget": 8})
        assert r.status_code == 200, r.text
        reply = r.json()
        calls = reply["choices"][0]["message"].get("tool_calls") or []
        called |= {c["function"]["name"] for c in calls}
        if mode == "ssr":
            left_out = reply["ssr"]["left_out"]
            assert set(left_out) >= IMAGE_CANDIDATES, left_out
            assert reply["ssr"]["candidate_id"] not in left_out
            assert len(reply["ssr"]["scores"]) == len(DEFAULT.candidates) - len(left_out)
    assert called and not called & IMAGE_TOOLS, called


@pytest.mark.parametrize("name", sorted(IMAGE_TOOLS))
def test_forcing_an_image_tool_without_an_image_is_refused(url: str, name: str) -> None:
    r = chat(url, tool_choice={"type": "function", "function": {"name": name}})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert f"{name} needs an image" in err["message"]


@pytest.mark.parametrize("mode", ["ssr", "freeform"])
def test_with_an_image_the_steered_model_calls_an_image_tool(url: str, demo_image_b64: str,
                                                             mode: str) -> None:
    messages = [{"role": "user", "content": [
        {"type": "text", "text": "What does the sign say?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + demo_image_b64}}]}]
    r = chat(url, messages=messages, tool_choice="required", ssr={"mode": mode, "reasoning_budget": 8})
    assert r.status_code == 200, r.text
    reply = r.json()
    assert reply["choices"][0]["message"]["tool_calls"][0]["function"]["name"] in IMAGE_TOOLS
    assert not set(reply["ssr"]["left_out"] or {}) & IMAGE_CANDIDATES  # answers are, under "required"

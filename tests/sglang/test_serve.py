"""Full agent runs through ``ssr-server serve --engine sglang`` against a real SGLang server, and the
agent's behaviour while SGLang is down and after it comes back (no agent restart)."""

from __future__ import annotations

import base64
import io
import time
from typing import Any

import httpx
import pytest

from ssr_server.tools.demo import demo_picture, shipped_demo_world

pytestmark = pytest.mark.sglang


def _image_b64() -> str:
    buf = io.BytesIO()
    demo_picture(shipped_demo_world().entity_ids()[0]).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


@pytest.mark.parametrize("mode", ["ssr", "freeform"])
def test_agent_runs_through_sglang(agent_url: str, mode: str) -> None:
    body = {"question": "What is this landmark?", "images": [_image_b64()], "mode": mode, "max_turns": 3,
            "tau": 1.0, "seed": 3, "reasoning_budget": 24}
    r = httpx.post(agent_url + "/v1/agent/runs", json=body, timeout=300)
    assert r.status_code == 200, r.text
    run = r.json()
    assert run["outcome"] in ("answered", "max_turns", "error")
    assert 1 <= len(run["turns"]) <= 3
    for turn in run["turns"]:
        assert turn["action_type"] in ("image_search", "text_search", "zoom", "answer")
        assert turn["reasoning_s"] > 0
        if mode == "ssr":
            assert len(turn["scores"]) == 6 and abs(sum(turn["q"]) - 1) < 1e-6
            # SGLang reports the image-expanded context and its radix-cache reuse
            assert turn["cached_tokens"] >= turn["context_tokens"] - 1
        else:
            assert turn["scores"] is None and turn["reasoning"] is not None
    metrics = httpx.get(agent_url + "/metrics", timeout=10).text
    assert f'ssr_runs_total{{mode="{mode}"' in metrics


def test_sglang_down_then_back(agent_url: str, sglang_control: Any) -> None:
    assert httpx.get(agent_url + "/ready", timeout=10).status_code == 200
    sglang_control.stop()
    try:
        ready = httpx.get(agent_url + "/ready", timeout=10)
        assert ready.status_code == 503 and ready.json()["ready"] is False
        r = httpx.post(agent_url + "/v1/agent/runs", json={"question": "hi", "max_turns": 1}, timeout=60)
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "engine_unavailable"
        assert "unreachable" in r.json()["error"]["message"]
    finally:
        sglang_control.start()
    deadline = time.monotonic() + 60
    while httpx.get(agent_url + "/ready", timeout=10).status_code != 200:
        assert time.monotonic() < deadline, "the agent did not see SGLang come back"
        time.sleep(0.5)
    r = httpx.post(agent_url + "/v1/agent/runs", json={"question": "hi", "max_turns": 1}, timeout=300)
    assert r.status_code == 200, r.text
    assert r.json()["outcome"] in ("answered", "max_turns", "error")

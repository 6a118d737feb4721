"""A real pretrained model served end to end: SmolLM2-135M-Instruct, in fp32 and bf16, over real HTTP.

Each dtype gets its own engine and a real uvicorn server (``bench.serve.live_server``). Assertions on the
model's choices are kept to what a 135M instruction-tuned model gets right by a wide margin under greedy
decoding: Paris as the capital of France, Paris as the city of a weather question.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch

CAPITALS = ["The capital of France is Paris.", "The capital of France is Berlin.",
            "The capital of France is Tokyo."]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                   "required": ["city"]}}}


@pytest.fixture(scope="module", params=["fp32", "bf16"])
def served(request: pytest.FixtureRequest, real_model_dir: Path,
           demo_tools: Any) -> Iterator[tuple[str, str]]:
    """(base URL, dtype): the model loaded in ``dtype`` behind a real server."""
    from ssr_server.bench.serve import live_server
    from ssr_server.core.config import Settings
    from ssr_server.engine.torch.config import EngineConfig
    from ssr_server.engine.torch.engine import TorchEngine

    dtype = str(request.param)
    engine = TorchEngine(str(real_model_dir), EngineConfig(dtype=dtype))
    try:
        with live_server(Settings(model=str(real_model_dir), dtype=dtype), engine, demo_tools) as url:
            yield url, dtype
    finally:
        asyncio.run(engine.close())


def test_selection_prefers_the_true_capital_by_a_wide_margin(served: tuple[str, str]) -> None:
    url, _ = served
    body = {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                         {"role": "user", "content": "What is the capital of France?"}],
            "candidates": CAPITALS}
    r = httpx.post(url + "/v1/ssr/select", json=body, timeout=120)
    assert r.status_code == 200, r.text
    sel = r.json()
    assert sel["text"] == CAPITALS[0] and sel["index"] == 0
    # the three differ in one word: the sums compare that word's log-probability (and what follows it)
    paris, berlin, tokyo = sel["logprob_sums"]
    assert paris - max(berlin, tokyo) > 3.0, sel["logprob_sums"]
    assert sel["scores"][0] > max(sel["scores"][1:]) and sel["q"][0] > 0.99
    assert len(set(sel["token_counts"])) == 1  # same length: the margin is not a length effect


def test_openai_route_calls_the_required_tool_with_the_city(served: tuple[str, str]) -> None:
    url, _ = served
    with openai.OpenAI(base_url=url + "/v1", api_key="unused", timeout=120, max_retries=0) as client:
        model = client.models.list().data[0].id
        resp = client.chat.completions.create(
            model=model, tools=[WEATHER], tool_choice="required", max_tokens=64,  # type: ignore[list-item]
            messages=[{"role": "user", "content": "What is the weather like in Paris today?"}])
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    fn = calls[0].function  # type: ignore[union-attr]
    assert fn.name == "get_weather"
    assert json.loads(fn.arguments) == {"city": "Paris"}
    assert resp.usage is not None and resp.usage.completion_tokens > 0


def test_agent_run_without_an_image_searches_text(served: tuple[str, str]) -> None:
    url, _ = served
    body = {"question": "What is the capital of France?", "max_turns": 1}
    r = httpx.post(url + "/v1/agent/runs", json=body, timeout=300)
    assert r.status_code == 200, r.text
    run = r.json()
    assert run["outcome"] in ("answered", "max_turns") and run["error"] is None
    (turn,) = run["turns"]
    # without an image, the moves that need one are left out, with their reason
    assert turn["action_type"] in ("text_search", "answer")
    assert all("needs an image" in why for why in turn["left_out"].values())
    assert turn["candidate_id"] not in turn["left_out"]
    if turn["action_type"] == "text_search":
        assert run["outcome"] == "max_turns" and turn["observation_ok"]
        query = turn["arguments"]["query"]
        assert any(w in query.lower() for w in ("paris", "france", "capital")), query
    else:
        assert run["outcome"] == "answered" and "paris" in run["answer"].lower()


def test_an_image_sent_to_the_text_only_model_is_refused_clearly(served: tuple[str, str]) -> None:
    import base64
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 30, 30)).save(buf, format="PNG")
    image = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    url, _ = served
    body = {"question": "What colour is this?", "images": [image], "max_turns": 1}
    r = httpx.post(url + "/v1/agent/runs", json=body, timeout=120)
    assert r.status_code == 400, r.text
    assert "takes no images" in r.json()["error"]["message"]


def test_bf16_decode_with_packed_weights_is_bit_identical(real_model_dir: Path) -> None:
    """The decode speed-ups for bf16 (weights packed once for oneDNN on CPUs with bf16 arithmetic, q/k/v
    and gate/up fused; decoder layers without module call overhead) leave every logit of a greedy
    decode unchanged: 16 steps with and without them, token for token."""
    from ssr_server.core.protocol import Context
    from ssr_server.engine.torch.config import EngineConfig
    from ssr_server.engine.torch.cpu_bf16 import has_native_bf16, use_packed
    from ssr_server.engine.torch.fast_layers import use_fast_layers
    from ssr_server.engine.torch.loader import load_model
    from ssr_server.engine.torch.prefix_cache import PrefixCache
    from ssr_server.engine.torch.runner import Chunk, ModelRunner

    lm = load_model(str(real_model_dir), EngineConfig(dtype="bf16"))
    packed = getattr(lm.model, "ssr_packed_linear_layers", 0)
    assert packed == (211 if has_native_bf16() else 0)  # 30 layers x 7 projections + the output head
    assert getattr(lm.model, "ssr_fused_linear_layers", 0) == (150 if has_native_bf16() else 0)
    assert lm.model.ssr_fast_layers == 30
    runner = ModelRunner(lm, PrefixCache(1 << 30))
    ids = list(lm.tokenizer.apply_chat_template([{"role": "user", "content": "Name three rivers of Europe."}],
                                                tokenize=True, add_generation_prompt=True, return_dict=False))

    def greedy(on: bool) -> tuple[list[int], list[torch.Tensor]]:
        use_packed(lm.model, on)
        use_fast_layers(lm.model, on)
        p = runner.prepare(Context(tuple(ids)), reserve=32)
        runner.prefill([p], insert=False)
        kv, logits, pos = p.kv, p.last_logits, p.next_pos
        assert kv is not None and logits is not None
        out_ids, out_logits = [], []
        for _ in range(16):
            tok = int(logits.argmax())
            out_ids.append(tok)
            out_logits.append(logits)
            chunk = Chunk(kv, [tok], torch.tensor([[pos]]), [0], past_len=kv.length)
            out = runner.forward([chunk])[0]
            if out.inplace:
                kv.length += 1
            else:
                kv.append(out.keys, out.values)
            logits, pos = out.logits[0], pos + 1
        return out_ids, out_logits

    plain_ids, plain_logits = greedy(False)
    packed_ids, packed_logits = greedy(True)
    assert packed_ids == plain_ids
    assert all(torch.equal(a, b) for a, b in zip(plain_logits, packed_logits, strict=True))
    assert lm.tokenizer.decode(plain_ids).strip()  # a real answer, not nothing

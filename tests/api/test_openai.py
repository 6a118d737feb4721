"""The OpenAI-compatible routes, driven by the real ``openai`` client (sync, async, streaming) against a
real uvicorn server: tool calls decoded under the client's schemas, SSR reasoning as
``reasoning_content``, tool results as observations with the prefix reused, errors in OpenAI's shape."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from ssr_server.core.formats.format import get_format

FORMAT = get_format()
OUR_TOOLS: list[dict[str, Any]] = [json.loads(json.dumps(t)) for t in FORMAT.tools]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 40},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def model_id(server_url: str) -> str:
    return str(httpx.get(server_url + "/v1/models", timeout=30).json()["data"][0]["id"])


@pytest.fixture(scope="module")
def oai(server_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server_url + "/v1", api_key="unused", timeout=120, max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def libraries(server_url: str) -> dict[str, dict[str, Any]]:
    return {lib["name"]: lib for lib in httpx.get(server_url + "/v1/libraries", timeout=30).json()}


@pytest.fixture(scope="module")
def picture_url(encode_image: Callable[..., bytes]) -> str:
    return "data:image/png;base64," + base64.b64encode(encode_image()).decode()


def question(picture_url: str, text: str = "Who designed this building?") -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "text", "text": text},
                                         {"type": "image_url", "image_url": {"url": picture_url}}]}]


def check_call(call: Any, tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The call names one of ``tools`` and its arguments satisfy that tool's JSON schema."""
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in by_name
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, by_name[call.function.name])
    return arguments  # type: ignore[no-any-return]


def check_selection(extra: dict[str, Any], reasoning: str, library: dict[str, Any]) -> None:
    """The returned reasoning is the chosen candidate's text, and with tau = 0 its score is the largest."""
    texts = {c["id"]: c["text"] for c in library["candidates"]}
    assert reasoning == texts[extra["candidate_id"]]
    scores = extra["scores"]
    assert 1 <= len(scores) <= len(texts)
    assert max(scores) in scores and abs(sum(extra["q"]) - 1.0) < 1e-6
    assert extra["q"][scores.index(max(scores))] == max(extra["q"])


def test_models_lists_the_served_model(oai: openai.OpenAI, model_id: str) -> None:
    models = oai.models.list()
    assert [m.id for m in models.data] == [model_id]
    assert models.data[0].object == "model"


def test_our_tools_get_a_call_under_their_schema(oai: openai.OpenAI, model_id: str, picture_url: str,
                                                 libraries: dict[str, dict[str, Any]]) -> None:
    resp = oai.chat.completions.create(model=model_id, messages=question(picture_url),  # type: ignore[arg-type]
                                       tools=OUR_TOOLS, tool_choice="required")  # type: ignore[arg-type]
    choice = resp.choices[0]
    assert choice.finish_reason in ("tool_calls", "length")
    msg = choice.message
    assert msg.content is None and msg.tool_calls is not None and len(msg.tool_calls) == 1
    if choice.finish_reason == "tool_calls":
        check_call(msg.tool_calls[0], OUR_TOOLS)
    extra = resp.model_extra or {}
    check_selection(extra["ssr"], msg.model_extra["reasoning_content"], libraries["default"])  # type: ignore[index]
    u = resp.usage
    assert u is not None and u.prompt_tokens > 0 and u.completion_tokens > 0
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.completion_tokens_details is not None
    assert 0 < (u.completion_tokens_details.reasoning_tokens or 0) < u.completion_tokens


def test_tool_choice_narrows_the_move(oai: openai.OpenAI, model_id: str, picture_url: str) -> None:
    forced = oai.chat.completions.create(
        model=model_id, messages=question(picture_url), tools=OUR_TOOLS,  # type: ignore[arg-type]
        tool_choice={"type": "function", "function": {"name": "text_search_tool"}})
    calls = forced.choices[0].message.tool_calls
    assert calls is not None and calls[0].function.name == "text_search_tool"
    none = oai.chat.completions.create(model=model_id, messages=question(picture_url),  # type: ignore[arg-type]
                                       tools=OUR_TOOLS, tool_choice="none")  # type: ignore[arg-type]
    msg = none.choices[0].message
    assert msg.tool_calls is None and isinstance(msg.content, str)
    assert none.choices[0].finish_reason in ("stop", "length")


def test_any_tool_set_is_served_by_the_generic_library(oai: openai.OpenAI, model_id: str,
                                                      libraries: dict[str, dict[str, Any]]) -> None:
    resp = oai.chat.completions.create(
        model=model_id, tools=[WEATHER], tool_choice="required", max_tokens=200,  # type: ignore[list-item]
        messages=[{"role": "system", "content": "You are a weather assistant."},
                  {"role": "user", "content": "Should I take an umbrella in Lyon today?"}])
    msg = resp.choices[0].message
    assert msg.tool_calls is not None
    args = check_call(msg.tool_calls[0], [WEATHER])
    assert args["unit"] in ("celsius", "fahrenheit")
    check_selection(resp.model_extra["ssr"], msg.model_extra["reasoning_content"],  # type: ignore[index]
                    libraries["generic-1"])


def test_stream_matches_the_whole_response(oai: openai.OpenAI, model_id: str, picture_url: str) -> None:
    kwargs: dict[str, Any] = {"model": model_id, "messages": question(picture_url), "tools": OUR_TOOLS,
                              "seed": 3}

    async def streamed() -> list[Any]:
        async with openai.AsyncOpenAI(base_url=str(oai.base_url), api_key="unused", timeout=120,
                                      max_retries=0) as client:
            stream = await client.chat.completions.create(
                stream=True, stream_options={"include_usage": True}, **kwargs)
            return [chunk async for chunk in stream]

    chunks = asyncio.run(streamed())
    whole = oai.chat.completions.create(**kwargs)
    assert chunks[0].choices[0].delta.role == "assistant"
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning_at = next(i for i, d in enumerate(deltas) if (d.model_extra or {}).get("reasoning_content"))
    action_at = next(i for i, d in enumerate(deltas) if d.tool_calls or d.content)
    assert reasoning_at < action_at  # the reasoning is sent before the action is decoded
    reasoning = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    content = "".join(d.content or "" for d in deltas)
    name = "".join(tc.function.name or "" for d in deltas for tc in d.tool_calls or () if tc.function)
    arguments = "".join(tc.function.arguments or "" for d in deltas for tc in d.tool_calls or ()
                        if tc.function)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    msg = whole.choices[0].message
    assert reasoning == msg.model_extra["reasoning_content"]  # type: ignore[index]
    assert finish == [whole.choices[0].finish_reason]
    if msg.tool_calls:
        assert (name, arguments) == (msg.tool_calls[0].function.name, msg.tool_calls[0].function.arguments)
    else:
        assert content == msg.content
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None and usage.total_tokens > 0


def test_tool_results_continue_the_conversation(oai: openai.OpenAI, model_id: str, picture_url: str) -> None:
    messages: list[Any] = question(picture_url)
    forced = {"type": "function", "function": {"name": "text_search_tool"}}
    first = oai.chat.completions.create(model=model_id, messages=messages, tools=OUR_TOOLS,  # type: ignore[arg-type]
                                        tool_choice=forced)  # type: ignore[arg-type]
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},  # no reasoning sent back
        {"role": "tool", "tool_call_id": call.id, "content": "Gomis Lighthouse\nhttps://example.org/gomis\n"
                                                             "Built in 1871 by the engineer Ana Brel."}]
    second = oai.chat.completions.create(model=model_id, messages=messages, tools=OUR_TOOLS)  # type: ignore[arg-type]
    assert second.choices[0].finish_reason in ("stop", "tool_calls", "length")
    u1, u2 = first.usage, second.usage
    assert u1 is not None and u2 is not None and u2.prompt_tokens_details is not None
    # The server restored the call's reasoning and reused the whole first prompt from its prefix cache.
    assert u2.prompt_tokens > u1.prompt_tokens + u1.completion_tokens
    assert (u2.prompt_tokens_details.cached_tokens or 0) >= u1.prompt_tokens


@pytest.mark.parametrize(("change", "status"), [
    ({"model": "gpt-4o"}, 404),
    ({"n": 2}, 400),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, 400),
    ({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}]}, 400),
    ({"messages": [{"role": "tool", "content": "x"}]}, 400),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]}, 400),
    ({"temperature": 9}, 400),
])
def test_errors_come_in_openai_shape(oai: openai.OpenAI, model_id: str, change: dict[str, Any],
                                     status: int) -> None:
    body: dict[str, Any] = {"model": model_id, "messages": [{"role": "user", "content": "hi"}],
                            "tools": OUR_TOOLS} | change
    with pytest.raises(openai.APIStatusError) as info:
        oai.chat.completions.create(**body)
    assert info.value.status_code == status
    err = info.value.body
    assert isinstance(err, dict) and set(err) == {"message", "type", "param", "code"}
    assert err["message"] and err["type"] == "invalid_request_error"


def test_broken_json_is_a_400_in_openai_shape(server_url: str) -> None:
    resp = httpx.post(server_url + "/v1/chat/completions", content=b'{"model": ', timeout=30,
                      headers={"content-type": "application/json"})
    assert resp.status_code == 400
    assert set(resp.json()["error"]) == {"message", "type", "param", "code"}


def test_completions_feed_the_turn_metrics(
        oai: openai.OpenAI, model_id: str, client: httpx.Client,
        metrics_scrape: Callable[[httpx.Client], dict[str, float]]) -> None:
    key = 'ssr_reasoning_seconds_count{mode="ssr"}'
    before = metrics_scrape(client).get(key, 0.0)
    oai.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "hello"}])
    assert metrics_scrape(client)[key] == before + 1

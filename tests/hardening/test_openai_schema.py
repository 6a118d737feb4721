"""The chat-completions request schema describes a valid request: schemathesis, generating from the
app's own OpenAPI document, gets real completions out of ``/v1/chat/completions`` (it got 0 of 431: 309
refusals and 122 unknown models), never a server error, and every refusal in OpenAI's shape. Real
clients' requests (the openai client's, the Agents SDK's) still validate against the same schema.

The document is narrowed only where a value belongs to the server, not to the protocol: the served
model and libraries (``describe_server``, what a deployment's document would say), the image (a test
server reaches no network: any URL but the demo picture is refused, as it must be), and the freeform
reasoning budget (CPU time).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from ssr_server.api.openai.protocol import describe_server
from ssr_server.core.config import Settings
from ssr_server.core.formats.format import get_format
from ssr_server.core.library import LibraryRegistry

MODEL = "ssr-tiny"


@pytest.fixture(scope="module")
def url(serve: Any) -> Iterator[str]:
    # A generous deadline: the protocol is under test here, not the deadline.
    config = Settings(max_concurrent_runs=4, max_queued_runs=64, run_deadline_s=120.0,
                      url_allowlist=("127.0.0.1",), allow_private_urls=False)
    with serve(config) as live:
        yield live.url


def document() -> dict[str, Any]:
    from ssr_server.api.app import create_app

    doc = create_app(Settings()).openapi()
    return describe_server(doc, MODEL, LibraryRegistry().names())


def for_this_test(doc: dict[str, Any], image_url: str) -> dict[str, Any]:
    schemas = doc["components"]["schemas"]
    schemas["ImageURL"]["properties"]["url"] = {"type": "string", "enum": [image_url]}
    schemas["SSRExtension"]["properties"]["reasoning_budget"]["maximum"] = 32
    return doc


def _stream_errors(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        if line.startswith("data: {"):
            chunk = json.loads(line[6:])
            if "error" in chunk:
                out.append(chunk["error"])
    return out


def test_the_live_document_names_the_served_model_and_libraries(url: str) -> None:
    """What a generator reading the running server's /openapi.json sees: the model and libraries it has."""
    live = httpx.get(f"{url}/openapi.json", timeout=30).json()
    served = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    assert live == document()
    schemas = live["components"]["schemas"]
    assert schemas["ChatCompletionRequest"]["properties"]["model"]["enum"] == [served] == [MODEL]


def test_generated_requests_get_completions(url: str, demo_image_b64: str) -> None:
    # from the running server's own document, as a generator outside would read it
    live = httpx.get(f"{url}/openapi.json", timeout=30).json()
    doc = for_this_test(live, "data:image/png;base64," + demo_image_b64)
    operation = schemathesis.openapi.from_dict(doc)["/v1/chat/completions"]["POST"]
    statuses: Counter[int] = Counter()
    broken: list[str] = []

    @settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
              database=None)
    @given(case=operation.as_strategy())
    def call(case: Any) -> None:
        response = case.call(base_url=url, timeout=120)
        statuses[response.status_code] += 1
        where = f"{case.as_curl_command()}\n-> {response.status_code} {response.text[:400]}"
        if response.status_code >= 500:
            broken.append(where)
        elif response.status_code >= 400:
            err = response.json().get("error", {})
            if set(err) != {"message", "type", "param", "code"} or not err["message"]:
                broken.append(where)
        elif any(e.get("type") == "server_error" for e in _stream_errors(response.text)):
            broken.append(where)  # a stream that failed after its 200

    call()
    total = sum(statuses.values())
    succeeded = sum(n for status, n in statuses.items() if 200 <= status < 300)
    assert not broken, "\n\n".join(broken[:3])
    assert succeeded >= total / 4, dict(statuses)


def test_the_document_names_this_server(url: str) -> None:
    doc = document()
    request = doc["components"]["schemas"]["ChatCompletionRequest"]
    assert request["properties"]["model"]["enum"] == [MODEL]
    assert httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"] == MODEL
    libraries = {lib["name"] for lib in httpx.get(f"{url}/v1/libraries", timeout=10).json()}
    library = doc["components"]["schemas"]["SSRExtension"]["properties"]["library"]
    assert set(next(b for b in library["anyOf"] if b.get("type") == "string")["enum"]) == libraries


# ---- real clients' requests validate against the schema ---------------------------------------------------
TOOLS = [json.loads(json.dumps(t)) for t in get_format().tools]
PICTURE = "data:image/png;base64,iVBORw0KGgo="
CLIENT_REQUESTS: list[dict[str, Any]] = [
    {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]},
    {"model": MODEL, "tools": TOOLS, "tool_choice": "required", "messages": [  # the openai client
        {"role": "user", "content": [{"type": "text", "text": "Who designed this building?"},
                                     {"type": "image_url", "image_url": {"url": PICTURE}}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "text_search_tool", "arguments": "{\"query\": \"Gomis Lighthouse\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Built in 1871 by Ana Brel."}],
     "stream": True, "stream_options": {"include_usage": True}, "seed": 3, "temperature": 0.0,
     "extra": "ignored", "ssr": {"library": "default", "tau": 0.0}},
    {"model": MODEL, "tool_choice": {"type": "function", "function": {"name": "text_search_tool"}},
     "tools": TOOLS, "messages": [  # the Agents SDK: a developer message, parts with detail, strict tools
         {"role": "developer", "content": "You search."},
         {"role": "user", "content": [
             {"type": "text", "text": "What is it?"},
             {"type": "image_url", "image_url": {"url": PICTURE, "detail": "auto"}}]},
         {"role": "assistant", "content": [{"type": "text", "text": "Looking."}], "tool_calls": [
             {"id": "c", "type": "function", "function": {"name": "image_search_tool", "arguments": "{}"}}]},
         {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "Title: x"}]}],
     "max_completion_tokens": 64, "n": 1, "logprobs": False, "response_format": {"type": "text"},
     "parallel_tool_calls": False},
    {"model": MODEL, "messages": [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                                  {"role": "user", "content": "Rain?"}],
     "tools": [{"type": "function", "function": {
         "name": "get_weather", "strict": True, "parameters": {
             "type": "object", "additionalProperties": False, "required": ["city", "unit"], "properties": {
                 "city": {"type": "string", "title": "City"},
                 "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}}]},
]


def _validator(doc: dict[str, Any]) -> jsonschema.Draft202012Validator:
    schema = {"$ref": "#/components/schemas/ChatCompletionRequest", "components": doc["components"]}
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("body", CLIENT_REQUESTS)
def test_real_clients_requests_fit_the_schema(body: dict[str, Any]) -> None:
    _validator(document()).validate(body)


@pytest.mark.parametrize("body", [
    {"model": MODEL, "messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]},
    {"model": MODEL, "messages": [{"role": "tool", "content": "x"}]},
    {"model": MODEL, "messages": [{"role": "system", "content": [
        {"type": "image_url", "image_url": {"url": PICTURE}}]}]},
    {"model": MODEL, "messages": [{"role": "user", "content": "a"}], "n": 2},
    {"model": "gpt-4o", "messages": [{"role": "user", "content": "a"}]},
])
def test_what_the_route_refuses_the_schema_refuses(url: str, body: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        _validator(document()).validate(body)
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    assert 400 <= r.status_code < 500 and set(r.json()["error"]) == {"message", "type", "param", "code"}

"""Schema fuzzing with schemathesis: whatever a client sends, the server never answers 5xx, and every
error has the one JSON shape ``{"error": {"code", "message"}}``.

The server under test is a real uvicorn server on 127.0.0.1 with small limits so that a valid run
stays short (``max_turns=2``, a 2 s deadline). Image URLs are refused before any name resolution, so
fuzzing never reaches beyond the loopback interface: the URL allow-list holds only 127.0.0.1, which is
refused as non-public, and a host ending in a number is an address or invalid, never looked up.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from ssr_server.core.config import Settings


@pytest.fixture(scope="module")
def fuzz_url(serve: Any) -> Iterator[str]:
    config = Settings(max_turns=2, run_deadline_s=2.0, max_concurrent_runs=4, max_queued_runs=16,
                      drain_timeout_s=5, url_allowlist=("127.0.0.1",), allow_private_urls=False)
    with serve(config) as live:
        yield live.url


def _branch(prop: dict[str, Any], kind: str) -> dict[str, Any]:
    """The ``kind`` branch of ``X | None`` (``anyOf``), or the property itself."""
    return next((b for b in prop.get("anyOf", []) if b.get("type") == kind), prop)


def _openapi() -> dict[str, Any]:
    """The app's own OpenAPI document (building the app loads no model; only its lifespan would),
    narrowed to what the fuzz server admits so that valid runs really run, and run briefly: without
    this nearly every generated run is refused up front (``max_turns`` over the server's limit, an
    empty ``candidates`` list) and the agent loop is never reached."""
    from ssr_server.api.app import create_app
    from ssr_server.api.openai.protocol import describe_server
    from ssr_server.core.library import LibraryRegistry

    # The served model and libraries, as a deployment's document names them: otherwise every chat
    # completion is refused as an unknown model and the route's work is never fuzzed.
    doc = describe_server(create_app(Settings()).openapi(), "ssr-tiny", LibraryRegistry().names())
    schemas = doc["components"]["schemas"]
    run = schemas["RunRequest"]["properties"]
    _branch(run["max_turns"], "integer")["maximum"] = 2
    run["reasoning_budget"]["maximum"] = 32
    run["images"]["maxItems"] = 1
    for props in (run, schemas["SelectRequest"]["properties"]):
        cands = _branch(props["candidates"], "array")
        cands.update(minItems=1, maxItems=4)
        cands["items"].update(minLength=1, maxLength=400)
    schemas["SelectRequest"]["properties"]["messages"]["maxItems"] = 8
    chat = schemas["ChatCompletionRequest"]["properties"]
    for cap in ("max_tokens", "max_completion_tokens"):
        _branch(chat[cap], "integer")["maximum"] = 64
    schemas["SSRExtension"]["properties"]["reasoning_budget"]["maximum"] = 32
    return doc


# Loaded eagerly: schemathesis' lazy ``from_fixture`` breaks on pytest 9 (no ``Node._nodeid``).
schema = schemathesis.openapi.from_dict(_openapi())


def _sse_errors(text: str) -> list[dict[str, Any]]:
    found = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        lines = block.split("\n")
        if any(ln.strip() == "event: error" for ln in lines):
            data = "\n".join(ln[5:].lstrip() for ln in lines if ln.startswith("data:"))
            found.append(json.loads(data))
    return found


def _header(response: Any, name: str) -> str:
    for key, values in response.headers.items():  # schemathesis: name -> list of values
        if key.lower() == name:
            return str(values[0] if isinstance(values, list) else values)
    return ""


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_server_errors(case: Any, fuzz_url: str) -> None:
    response = case.call(base_url=fuzz_url, timeout=30)
    where = (f"{case.operation.label}\n{case.as_curl_command()}\n"
             f"-> {response.status_code} {response.text[:500]}")
    assert response.status_code < 500, where
    ctype = _header(response, "content-type")
    if response.status_code >= 400:
        assert ctype.startswith("application/json"), where
        err = response.json().get("error")
        assert isinstance(err, dict) and err.get("code") and err.get("message"), where
    elif ctype.startswith("text/event-stream"):
        bad = [e for e in _sse_errors(response.text) if e.get("status", 500) >= 500]
        assert not bad, where


def test_omitted_max_turns_fits_a_lower_server_limit(fuzz_url: str) -> None:
    """A server configured with max_turns=2 must still serve a request that does not mention
    max_turns (the request default is 6): the client asked for nothing over the limit."""
    import httpx

    r = httpx.post(f"{fuzz_url}/v1/agent/runs", json={"question": "What is this?"}, timeout=30)
    assert r.status_code == 200, r.text
    assert 1 <= len(r.json()["turns"]) <= 2

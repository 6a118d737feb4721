"""Fixtures of the API tests: one torch thread, a way to start a server with special settings,
and small helpers (PNG payloads, SSE parsing, Prometheus parsing) shared by the API test modules."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ssr_server.tools.demo import demo_picture, shipped_demo_world

ServerFactory = Callable[..., AbstractContextManager[str]]


@pytest.fixture(scope="session")
def serve(request: pytest.FixtureRequest, torch_engine: Any, demo_tools: Any) -> ServerFactory:
    """``with serve(Settings(...)) as url:`` a real server (tests/conftest.py's ``live_server``) on the
    session's engine and demo tools, for tests that need special settings."""
    path = Path(__file__).resolve().parent.parent / "conftest.py"
    top = request.config.pluginmanager.get_plugin(str(path))
    if top is None:  # registered under another spelling of the path
        top = next(p for p in request.config.pluginmanager.get_plugins()
                   if Path(getattr(p, "__file__", "") or "/").resolve() == path)
    live_server = top.live_server

    def factory(settings: Any) -> AbstractContextManager[str]:
        return live_server(settings, torch_engine, demo_tools)  # type: ignore[no-any-return]

    return factory


def image_bytes(fmt: str = "PNG", size: tuple[int, int] | None = None, entity: int = 0) -> bytes:
    img = demo_picture(shipped_demo_world().entity_ids()[entity])
    if size is not None:
        img = img.resize(size)
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


@pytest.fixture(scope="session")
def png_b64() -> str:
    """A demo picture as plain base64 PNG."""
    return base64.b64encode(image_bytes()).decode()


@pytest.fixture(scope="session")
def encode_image() -> Callable[..., bytes]:
    """``encode_image(fmt="PNG", size=None, entity=0)``: a demo picture's bytes in a format."""
    return image_bytes


def parse_sse(lines: Iterator[str]) -> list[tuple[str, dict[str, Any]]]:
    """(event, data) pairs of an SSE stream; comments (pings) skipped, data lines joined."""
    events: list[tuple[str, dict[str, Any]]] = []
    event = "message"
    data: list[str] = []
    for line in lines:
        if line == "":
            if data:
                events.append((event, json.loads("\n".join(data))))
            event, data = "message", []
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)
    if data:
        events.append((event, json.loads("\n".join(data))))
    return events


@pytest.fixture(scope="session")
def sse_post() -> Callable[..., tuple[int, str, list[tuple[str, dict[str, Any]]]]]:
    """``sse_post(url, json)`` -> (status, content type, events)."""

    def post(url: str, body: dict[str, Any]) -> tuple[int, str, list[tuple[str, dict[str, Any]]]]:
        with httpx.stream("POST", url, json=body, timeout=120) as resp:
            ctype = resp.headers.get("content-type", "")
            if resp.status_code != 200:
                resp.read()
                return resp.status_code, ctype, [("http", resp.json())]
            return resp.status_code, ctype, parse_sse(resp.iter_lines())

    return post


def scrape(client: httpx.Client) -> dict[str, float]:
    """Every sample of /metrics as {'name{label="v",...}': value} (labels sorted)."""
    resp = client.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(resp.text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


@pytest.fixture(scope="session")
def metrics_scrape() -> Callable[[httpx.Client], dict[str, float]]:
    return scrape


def assert_error_shape(resp: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert isinstance(err["code"], str) and err["code"]
    assert isinstance(err["message"], str) and err["message"]
    assert set(err) <= {"code", "message", "details"}
    if code is not None:
        assert err["code"] == code, err
    return err  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def error_shape() -> Callable[..., dict[str, Any]]:
    """``error_shape(resp, status, code=None)``: assert the one JSON error shape; returns the error."""
    return assert_error_shape

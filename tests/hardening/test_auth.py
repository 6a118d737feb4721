"""API key: every /v1 path needs ``Authorization: Bearer <key>``; probes and metrics stay open."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ssr_server.core.config import Settings

KEY = "s3cret"
GOOD = {"Authorization": f"Bearer {KEY}"}
SELECT_BODY = {"messages": [{"role": "user", "content": "What is in the image?"}]}
RUN_BODY = {"question": "What is this?", "mode": "ssr", "max_turns": 1}
V1_CALLS: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "/v1/libraries", None),
    ("GET", "/v1/stats", None),
    ("POST", "/v1/agent/runs", RUN_BODY),
    ("POST", "/v1/ssr/select", SELECT_BODY),
]
WRONG_AUTH = [
    None,  # no header at all
    "Bearer wrong",
    f"Bearer {KEY}x",
    f"Bearer {KEY[:-1]}",
    f"Bearer {KEY} {KEY}",
    "Bearer",
    KEY,  # no scheme
    f"Basic {KEY}",
    f"Token {KEY}",
    f"Bearer {KEY.upper()}",
]


@pytest.fixture(scope="module")
def url(serve: Any) -> Iterator[str]:
    with serve(Settings(api_key=KEY)) as live:
        yield live.url


@pytest.fixture(scope="module")
def http(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=30) as c:
        yield c


def _assert_401(r: httpx.Response) -> None:
    assert r.status_code == 401, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert r.headers.get("www-authenticate", "").lower().startswith("bearer")
    err = r.json()["error"]
    assert err["code"] == "unauthorized"
    assert KEY not in r.text


@pytest.mark.parametrize("auth", WRONG_AUTH, ids=lambda a: "none" if a is None else repr(a))
@pytest.mark.parametrize(("method", "path", "body"), V1_CALLS, ids=[c[1] for c in V1_CALLS])
def test_v1_without_the_right_key_is_401(http: httpx.Client, method: str, path: str,
                                         body: dict[str, Any] | None, auth: str | None) -> None:
    headers = {} if auth is None else {"Authorization": auth}
    _assert_401(http.request(method, path, json=body, headers=headers))


def test_401_comes_before_body_parsing(http: httpx.Client) -> None:
    """An unauthenticated caller learns nothing about the API: no 400/422 for a broken body."""
    r = http.post("/v1/agent/runs", content=b"{not json", headers={"Content-Type": "application/json"})
    _assert_401(r)
    _assert_401(http.post("/v1/agent/runs", json={"unknown": 1}))
    _assert_401(http.get("/v1/no-such-route"))
    _assert_401(http.get("/openapi.json"))


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
def test_right_key_is_accepted(http: httpx.Client, scheme: str) -> None:
    headers = {"Authorization": f"{scheme} {KEY}"}
    r = http.get("/v1/libraries", headers=headers)
    assert r.status_code == 200, r.text
    assert any(lib["name"] == "default" for lib in r.json())
    assert http.get("/v1/stats", headers=headers).status_code == 200


def test_right_key_runs_and_selects(http: httpx.Client) -> None:
    r = http.post("/v1/agent/runs", json=RUN_BODY, headers=GOOD)
    assert r.status_code == 200, r.text
    assert r.json()["outcome"] in {"answered", "max_turns", "error"}
    r = http.post("/v1/ssr/select", json=SELECT_BODY, headers=GOOD)
    assert r.status_code == 200, r.text
    assert r.json()["candidate_id"]


@pytest.mark.parametrize("path", ["/health", "/ready", "/metrics"])
def test_probes_and_metrics_are_open_by_default(http: httpx.Client, path: str) -> None:
    r = http.get(path)
    assert r.status_code == 200, r.text
    assert http.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 200


def test_rejections_are_counted(http: httpx.Client, read_metric: Any, url: str) -> None:
    before = read_metric(url, "ssr_requests_rejected_total", reason="unauthorized")
    for _ in range(3):
        _assert_401(http.get("/v1/libraries"))
    assert read_metric(url, "ssr_requests_rejected_total", reason="unauthorized") == before + 3


def test_open_paths_are_configurable(serve: Any) -> None:
    with serve(Settings(api_key=KEY, open_paths=("/health",))) as live, \
            httpx.Client(base_url=live.url, timeout=30) as c:
        assert c.get("/health").status_code == 200
        for path in ("/metrics", "/ready"):
            _assert_401(c.get(path))
            _assert_401(c.get(path, headers={"Authorization": "Bearer nope"}))
            assert c.get(path, headers=GOOD).status_code == 200
        _assert_401(c.get("/v1/libraries"))
        assert c.get("/v1/libraries", headers=GOOD).status_code == 200


def test_no_key_configured_means_open(serve: Any) -> None:
    with serve(Settings(api_key=None)) as live, httpx.Client(base_url=live.url, timeout=30) as c:
        assert c.get("/v1/libraries").status_code == 200
        assert c.get("/v1/libraries", headers={"Authorization": "Bearer anything"}).status_code == 200

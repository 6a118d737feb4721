"""POST /v1/agent/runs over real HTTP: both modes, plain JSON and SSE, and the probes."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

OUTCOMES = {"answered", "max_turns", "error", "cancelled", "timeout", "context_limit"}
RUN_FIELDS = {"id", "question", "mode", "library", "outcome", "answer", "error", "turns", "timings", "usage"}
TURN_FIELDS = {"index", "mode", "candidate_id", "reasoning", "scores", "q", "left_out", "action_type",
               "tool_name", "argument", "arguments", "action_text", "observation", "observation_ok",
               "tool_data", "error", "reasoning_span", "action_span",
               "context_tokens", "cached_tokens",
               "scored_tokens", "reasoning_tokens", "action_tokens", "action_forwards", "reasoning_s",
               "action_s", "tool_s", "turn_s"}
ACTION_TYPES = {"image_search", "text_search", "zoom", "answer"}


@pytest.fixture(scope="module")
def default_library(server_url: str) -> dict[str, Any]:
    libs = httpx.get(server_url + "/v1/libraries", timeout=30).json()
    return next(lib for lib in libs if lib["name"] == "default")


def check_run(run: dict[str, Any], body: dict[str, Any], library: dict[str, Any] | None) -> None:
    """The response of one run, checked against its request and (ssr) its library."""
    assert set(run) == RUN_FIELDS
    assert run["outcome"] in OUTCOMES - {"cancelled"}
    assert run["question"] == body["question"]
    assert run["mode"] == body.get("mode", "ssr")
    assert len(run["id"]) >= 16
    turns = run["turns"]
    assert 1 <= len(turns) <= body.get("max_turns", 6)
    assert [t["index"] for t in turns] == list(range(len(turns)))
    if run["outcome"] == "answered":
        assert turns[-1]["action_type"] == "answer" and run["answer"] == turns[-1]["argument"]
    else:
        assert run["answer"] is None
    if run["outcome"] == "max_turns":
        assert len(turns) == body.get("max_turns", 6)
    for t in turns:
        assert set(t) == TURN_FIELDS
        assert t["mode"] == run["mode"]
        assert t["action_type"] in ACTION_TYPES
        if t["action_type"] == "answer":  # the reference format's actions
            assert t["action_text"].startswith("\n<answer>") and t["action_text"].endswith("</answer>")
            assert t["tool_name"] is None and t["arguments"] is None
        else:
            assert t["action_text"].startswith(f'\n<tool_call>\n{{"name": "{t["tool_name"]}", "arguments": ')
            assert t["action_text"].endswith("}\n</tool_call>")
            assert isinstance(t["arguments"], dict) and t["argument"]
        assert t["reasoning_s"] > 0 and t["action_s"] > 0 and t["tool_s"] >= 0
        assert t["turn_s"] >= t["reasoning_s"] + t["action_s"] + t["tool_s"]
        assert t["context_tokens"] > 0 and 0 <= t["cached_tokens"] <= t["context_tokens"]
        if run["mode"] == "ssr":
            assert library is not None
            cand = {c["id"]: c for c in library["candidates"]}[t["candidate_id"]]
            assert t["reasoning"] == cand["text"]
            if cand["action"] not in ("any", "tool"):
                assert t["action_type"] == cand["action"]
            assert set(t["left_out"]) <= {c["id"] for c in library["candidates"]}
            assert t["candidate_id"] not in t["left_out"]
            assert len(t["scores"]) == len(t["q"]) == len(library["candidates"]) - len(t["left_out"])
            assert math.isclose(sum(t["q"]), 1.0, abs_tol=1e-6)
            assert t["scored_tokens"] > 0 and t["reasoning_tokens"] == 0
        else:
            assert t["candidate_id"] is None and t["scores"] is None and t["q"] is None
            assert 1 <= t["reasoning_tokens"] <= body.get("reasoning_budget", 256)
    timings, usage = run["timings"], run["usage"]
    model_s = sum(t["reasoning_s"] + t["action_s"] for t in turns)
    assert math.isclose(timings["model_s"], model_s, rel_tol=1e-6)
    assert math.isclose(timings["tool_s"], sum(t["tool_s"] for t in turns), rel_tol=1e-6, abs_tol=1e-9)
    assert timings["total_s"] >= timings["model_s"] + timings["tool_s"] > 0
    assert usage["scored_tokens"] == sum(t["scored_tokens"] for t in turns)
    assert usage["generated_tokens"] == sum(t["reasoning_tokens"] + t["action_tokens"] for t in turns)
    assert usage["prompt_tokens"] >= turns[-1]["context_tokens"] > 0


# ---- probes ----------------------------------------------------------------------------------------
def test_health_and_ready(client: httpx.Client) -> None:
    r = client.get("/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    r = client.get("/ready")
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert body["ready"] is True and body["draining"] is False
    assert isinstance(body["engine"], str) and body["engine"]
    assert body["runs_in_flight"] == 0 and body["runs_queued"] == 0


def test_libraries(client: httpx.Client) -> None:
    r = client.get("/v1/libraries")
    assert r.status_code == 200
    libs = r.json()
    names = [lib["name"] for lib in libs]
    assert "default" in names and len(names) == len(set(names))
    for lib in libs:
        assert isinstance(lib["description"], str)
        assert 1 <= len(lib["candidates"]) <= 16
        ids = [c["id"] for c in lib["candidates"]]
        assert len(ids) == len(set(ids))
        for c in lib["candidates"]:
            assert set(c) == {"id", "text", "action"}
            assert c["action"] in ACTION_TYPES | {"tool", "any"}
    default = next(lib for lib in libs if lib["name"] == "default")
    assert len(default["candidates"]) == 6


# ---- plain runs --------------------------------------------------------------------------------------
def test_ssr_run(client: httpx.Client, png_b64: str, default_library: dict[str, Any]) -> None:
    body = {"question": "What is this landmark?", "images": [png_b64], "tau": 1.0, "seed": 4, "max_turns": 3}
    r = client.post("/v1/agent/runs", json=body)
    assert r.status_code == 200, r.text
    run = r.json()
    check_run(run, body, default_library)
    assert run["library"] == "default"


def test_freeform_run(client: httpx.Client, png_b64: str) -> None:
    body = {"question": "What is this landmark?", "images": [png_b64], "mode": "freeform", "max_turns": 2,
            "reasoning_budget": 8}
    r = client.post("/v1/agent/runs", json=body)
    assert r.status_code == 200, r.text
    check_run(r.json(), body, None)


def test_data_url_image_and_several_images(client: httpx.Client, png_b64: str,
                                           default_library: dict[str, Any]) -> None:
    one = {"question": "What is it?", "images": [png_b64], "max_turns": 1}
    two = {"question": "What is it?", "images": [png_b64, "data:image/png;base64," + png_b64], "max_turns": 1}
    r1, r2 = client.post("/v1/agent/runs", json=one), client.post("/v1/agent/runs", json=two)
    assert r1.status_code == r2.status_code == 200
    check_run(r1.json(), one, default_library)
    check_run(r2.json(), two, default_library)
    # the second image really is in the context
    assert r2.json()["turns"][0]["context_tokens"] > r1.json()["turns"][0]["context_tokens"]


def test_explicit_candidates_and_label_only(client: httpx.Client) -> None:
    texts = ["Searching the web with the picture should identify it.", "The answer is plain to see."]
    body = {"question": "What is it?", "candidates": texts, "tau": 1.0, "seed": 1, "max_turns": 2}
    run = client.post("/v1/agent/runs", json=body).json()
    lib = {"name": "custom", "candidates": [{"id": f"c{i + 1}", "text": t, "action": "any"}
                                            for i, t in enumerate(texts)]}
    check_run(run, body, lib)
    assert run["library"] == "custom"

    body = {"question": "What is it?", "label_only": True, "tau": 1.0, "seed": 2, "max_turns": 2}
    run = client.post("/v1/agent/runs", json=body).json()
    assert run["outcome"] in OUTCOMES
    libs = client.get("/v1/libraries").json()
    ids = [c["id"] for c in next(x for x in libs if x["name"] == "default")["candidates"]]
    for t in run["turns"]:  # the label is the number the system prompt lists the strategy under (by id)
        assert t["reasoning"] == f"[{sorted(ids).index(t['candidate_id'])}]"


def test_other_library(client: httpx.Client) -> None:
    libs = {lib["name"]: lib for lib in client.get("/v1/libraries").json()}
    name = next(n for n in sorted(libs) if n != "default")
    body = {"question": "What is it?", "library": name, "max_turns": 2, "tau": 1.0, "seed": 0}
    r = client.post("/v1/agent/runs", json=body)
    assert r.status_code == 200, r.text
    run = r.json()
    assert run["library"] == name
    check_run(run, body, libs[name])


def test_a_run_without_an_image_never_zooms_or_searches_by_image(client: httpx.Client, png_b64: str,
                                                                 default_library: dict[str, Any]) -> None:
    """The rationales whose move needs an image are left out of the selection (the turn says so), and no
    image move is decoded, whatever is sampled."""
    image_moves = {c["id"] for c in default_library["candidates"] if c["action"] in ("zoom", "image_search")}
    for seed in range(3):
        body = {"question": "Which city is the capital of France?", "tau": 5.0, "seed": seed, "max_turns": 3,
                "action_temperature": 1.0}
        r = client.post("/v1/agent/runs", json=body)
        assert r.status_code == 200, r.text
        run = r.json()
        check_run(run, body, default_library)
        for t in run["turns"]:
            assert t["action_type"] in ("text_search", "answer"), t["action_text"]
            assert set(t["left_out"]) == image_moves
            assert all("needs an image" in why for why in t["left_out"].values())
    with_image = client.post("/v1/agent/runs", json={"question": "What is it?", "max_turns": 1,
                                                     "images": [png_b64]}).json()
    assert with_image["turns"][0]["left_out"] == {}


def test_a_library_of_image_moves_needs_an_image(serve: Any, tmp_path: Path, png_b64: str,
                                                 error_shape: Callable[..., dict[str, Any]]) -> None:
    """Refused before it runs (it would only fail, as its zooms once did: "images 0 to -1 are
    available"); with an image it runs."""
    from ssr_server.core.config import Settings

    (tmp_path / "look.yaml").write_text(
        "name: look\ndescription: image moves only\ncandidates:\n"
        "  - id: zoom\n    text: Zoom into the detail.\n    action: zoom\n"
        "  - id: search\n    text: Search with the image.\n    action: image_search\n", encoding="utf-8")
    with serve(Settings(library_dirs=[str(tmp_path)])) as url:
        bare = {"question": "What is it?", "library": "look"}
        r = httpx.post(f"{url}/v1/agent/runs", json=bare, timeout=60)
        err = error_shape(r, 400, "invalid_request")
        assert "without an image" in err["message"]
        body = {"question": "What is it?", "library": "look", "images": [png_b64], "max_turns": 1}
        r = httpx.post(f"{url}/v1/agent/runs", json=body, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["turns"][0]["action_type"] in ("zoom", "image_search")


# ---- streaming ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["ssr", "freeform"])
def test_stream_sends_one_event_per_turn_then_the_run(
        server_url: str, client: httpx.Client, png_b64: str, default_library: dict[str, Any], mode: str,
        sse_post: Callable[..., tuple[int, str, list[tuple[str, dict[str, Any]]]]]) -> None:
    body: dict[str, Any] = {"question": "What is this landmark?", "images": [png_b64], "mode": mode,
                            "tau": 1.0, "seed": 7, "max_turns": 3, "reasoning_budget": 8, "stream": True}
    status, ctype, events = sse_post(server_url + "/v1/agent/runs", body)
    assert status == 200 and ctype.startswith("text/event-stream")
    names = [e for e, _ in events]
    assert names[-1] == "run" and names.count("run") == 1
    assert set(names[:-1]) <= {"turn"}
    run = events[-1][1]
    check_run(run, body, default_library if mode == "ssr" else None)
    turn_events = [d for e, d in events if e == "turn"]
    assert len(turn_events) == len(run["turns"]) >= 1
    assert turn_events == run["turns"]

    # the same request without streaming runs the same way (same seed, same choices)
    plain = client.post("/v1/agent/runs", json={**body, "stream": False}).json()
    assert [t["candidate_id"] for t in plain["turns"]] == [t["candidate_id"] for t in run["turns"]]
    assert [t["action_text"] for t in plain["turns"]] == [t["action_text"] for t in run["turns"]]
    assert plain["outcome"] == run["outcome"]


def test_stream_refusals_are_plain_json_errors(
        server_url: str, error_shape: Callable[..., dict[str, Any]]) -> None:
    r = httpx.post(server_url + "/v1/agent/runs", json={"question": "x", "library": "nope", "stream": True})
    error_shape(r, 404, "unknown_library")

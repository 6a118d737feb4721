"""The stored runs' API over real HTTP on a real server keeping its runs in SQLite (and, for the round
trip, PostgreSQL): a run on record as it was answered, listing with filters and cursors, background runs,
live events, cancel, delete, images by reference, and ``SSR_RUN_STORE=off``."""

from __future__ import annotations

import io
from typing import Any

import httpx
import pytest
from PIL import Image


def _sse(resp: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    import json

    events, name, data = [], "message", []
    for line in resp.iter_lines():
        if line == "":
            if data:
                events.append((name, json.loads("\n".join(data))))
            name, data = "message", []
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())
    return events


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_stored_run_reads_back_as_it_was_answered(backend: str, request: pytest.FixtureRequest,
                                                    stored: Any, demo_png_b64: str, kit: Any) -> None:
    url_of = request.getfixturevalue("sqlite_url" if backend == "sqlite" else "postgres_url")
    body = {"question": "What is the object in the image?", "images": [demo_png_b64], "max_turns": 3,
            "seed": 1, "tau": 1.0}
    with stored(url_of) as url:
        answered = httpx.post(f"{url}/v1/agent/runs", json=body, timeout=120).json()
        run = kit.get_run(url, answered["id"])
        assert run["status"] == ("failed" if answered["outcome"] == "error" else "completed")
        assert run["outcome"] == answered["outcome"] and run["answer"] == answered["answer"]
        assert run["question"] == body["question"] and run["mode"] == "ssr"
        assert run["turns"] == answered["turns"]  # every field of every turn, as answered
        assert run["turn_count"] == len(answered["turns"])
        assert run["options"]["seed"] == 1 and run["options"]["max_turns"] == 3
        assert run["total_s"] == pytest.approx(answered["timings"]["total_s"])
        # the image as the model saw it, by reference
        first = run["images"][0]
        assert first["n"] == 0 and first["source"] == "input"
        img = httpx.get(url + first["url"], timeout=30)
        assert img.status_code == 200 and img.headers["content-type"] == first["media_type"]
        with Image.open(io.BytesIO(img.content)) as pic:
            assert pic.size == (first["width"], first["height"])
        assert httpx.get(f"{url}/v1/agent/runs/{run['id']}/images/99", timeout=30).status_code == 404
        # a zoom's crop is kept too, with its box on its source image
        for t in run["turns"]:
            if t["action_type"] == "zoom" and t["observation_ok"]:
                crop = next(i for i in run["images"] if i["n"] == t["tool_data"]["image"])
                assert crop["source"] == "zoom" and crop["box"] == t["tool_data"]["box"]
        # not stored when asked not to
        unstored = httpx.post(f"{url}/v1/agent/runs", json={**body, "store": False}, timeout=120).json()
        r = httpx.get(f"{url}/v1/agent/runs/{unstored['id']}", timeout=30)
        assert r.status_code == 404 and r.json()["error"]["code"] == "run_not_found"
    with stored(url_of) as url:  # a new server on the same store
        assert kit.get_run(url, answered["id"])["turns"] == answered["turns"]
        d = httpx.delete(f"{url}/v1/agent/runs/{answered['id']}", timeout=30)
        assert d.status_code == 204
        assert httpx.get(f"{url}/v1/agent/runs/{answered['id']}", timeout=30).status_code == 404
        assert httpx.delete(f"{url}/v1/agent/runs/{answered['id']}", timeout=30).status_code == 404


def test_listing_filters_and_pages_with_a_cursor(stored: Any, sqlite_url: str) -> None:
    with stored(sqlite_url) as url:
        ids = []
        for i, mode in enumerate(["ssr", "freeform", "ssr", "ssr", "freeform"]):
            body = {"question": f"Question {i}?", "mode": mode, "max_turns": 1, "reasoning_budget": 4,
                    "library": "generic-1"}
            r = httpx.post(f"{url}/v1/agent/runs", json=body, timeout=120)
            assert r.status_code == 200, r.text
            ids.append(r.json()["id"])
        seen, after = [], None
        while True:
            params: dict[str, Any] = {"limit": 2, **({"after": after} if after else {})}
            page = httpx.get(f"{url}/v1/agent/runs", params=params, timeout=30).json()
            assert len(page["data"]) <= 2
            seen += [r["id"] for r in page["data"]]
            if not page["has_more"]:
                assert page["next_after"] is None
                break
            after = page["next_after"]
        assert seen == ids[::-1]  # newest first, each once
        free = httpx.get(f"{url}/v1/agent/runs", params={"mode": "freeform"}, timeout=30).json()["data"]
        assert [r["id"] for r in free] == [ids[4], ids[1]]
        assert all(r["status"] in ("completed", "failed") for r in free)
        none = httpx.get(f"{url}/v1/agent/runs", params={"since": "2999-01-01T00:00:00Z"}, timeout=30)
        assert none.json()["data"] == []
        bad = httpx.get(f"{url}/v1/agent/runs", params={"after": "nosuchrun"}, timeout=30)
        assert bad.status_code == 400 and "cursor" in bad.json()["error"]["message"]
        assert httpx.get(f"{url}/v1/agent/runs", params={"status": "nope"}, timeout=30).status_code == 422
        assert httpx.get(f"{url}/v1/agent/runs", params={"limit": 0}, timeout=30).status_code == 422


def test_a_background_run_is_queued_then_running_then_completed(stored: Any, sqlite_url: str,
                                                               search: Any, kit: Any) -> None:
    with stored(sqlite_url, search) as url:
        r = httpx.post(f"{url}/v1/agent/runs", json={**kit.GATED, "background": True}, timeout=60)
        assert r.status_code == 202, r.text
        accepted = r.json()
        assert accepted["status"] == "queued" and r.headers["location"] == accepted["url"]
        run_id = accepted["id"]
        # the first search answers, the second is held: the run is running with one finished turn
        running = kit.wait_for(lambda: (g := kit.get_run(url, run_id))["turn_count"] >= 1 and g,
                               what="a turn")
        assert running["status"] == "running" and running["finished_at"] is None
        assert len(running["turns"]) == running["turn_count"] == 1
        with httpx.stream("GET", f"{url}/v1/agent/runs/{run_id}/events", timeout=60) as events:
            search.open()  # the rest of the run goes on while the stream is open
            got = _sse(events)
        done = kit.get_run(url, run_id)
        assert done["status"] == "completed" and done["outcome"] in ("max_turns", "answered")
        assert [e for e, _ in got].count("turn") == len(done["turns"])
        assert [d["index"] for e, d in got if e == "turn"] == list(range(len(done["turns"])))
        assert got[-1][0] == "run" and got[-1][1]["turns"] == done["turns"]
        statuses = [d["status"] for e, d in got if e == "status"]
        assert statuses[0] == "running" and statuses[-1] == "completed"
        # a finished run cannot be cancelled
        c = httpx.post(f"{url}/v1/agent/runs/{run_id}/cancel", timeout=30)
        assert c.status_code == 409 and c.json()["error"]["code"] == "run_conflict"


def test_cancel_ends_a_background_run_with_its_finished_turns(stored: Any, sqlite_url: str,
                                                            search: Any, kit: Any) -> None:
    with stored(sqlite_url, search) as url:
        r = httpx.post(f"{url}/v1/agent/runs", json={**kit.GATED, "background": True}, timeout=60)
        run_id = r.json()["id"]
        kit.wait_for(lambda: kit.get_run(url, run_id)["turn_count"] >= 1, what="a turn")
        gone = httpx.delete(f"{url}/v1/agent/runs/{run_id}", timeout=30)
        assert gone.status_code == 409  # in flight: cancel it first
        r = httpx.post(f"{url}/v1/agent/runs/{run_id}/cancel", timeout=30)
        assert r.status_code == 200, r.text
        run = r.json()
        assert run["status"] == "cancelled" and run["outcome"] == "cancelled"
        assert run["turn_count"] == len(run["turns"]) == 1 and run["finished_at"] is not None
        # its admission slot is free again: a new run is admitted and served
        search.open()
        ok = httpx.post(f"{url}/v1/agent/runs", json={**kit.GATED, "max_turns": 1}, timeout=60)
        assert ok.status_code == 200


def test_a_foreground_run_cancelled_through_the_api_answers_with_what_it_did(
        stored: Any, sqlite_url: str, search: Any, kit: Any) -> None:
    import threading

    with stored(sqlite_url, search) as url:
        answer: list[httpx.Response] = []
        t = threading.Thread(target=lambda: answer.append(
            httpx.post(f"{url}/v1/agent/runs", json=kit.GATED, timeout=60)))
        t.start()
        page = kit.wait_for(lambda: (p := httpx.get(f"{url}/v1/agent/runs", params={"status": "running"},
                                                timeout=30).json()["data"]) and p[0]["turn_count"] >= 1 and p,
                        what="the run in flight")
        assert httpx.post(f"{url}/v1/agent/runs/{page[0]['id']}/cancel", timeout=30).status_code == 200
        t.join(30)
        assert answer and answer[0].status_code == 200
        assert answer[0].json()["outcome"] == "cancelled" and len(answer[0].json()["turns"]) == 1


def test_background_runs_are_refused_clearly_without_a_store(stored: Any, serve_off: Any) -> None:
    with serve_off() as url:
        r = httpx.post(f"{url}/v1/agent/runs", json={"question": "What?", "background": True}, timeout=30)
        assert r.status_code == 400 and "SSR_RUN_STORE=off" in r.json()["error"]["message"]
        plain = httpx.post(f"{url}/v1/agent/runs", json={"question": "What?", "max_turns": 1,
                                                         "library": "generic-1"}, timeout=120)
        assert plain.status_code == 200
        for path in (f"/v1/agent/runs/{plain.json()['id']}", "/v1/agent/runs"):
            g = httpx.get(url + path, timeout=30)
            assert g.status_code == 404 and g.json()["error"]["code"] == "run_store_off"


def test_background_and_stream_together_are_refused(stored: Any, sqlite_url: str) -> None:
    with stored(sqlite_url) as url:
        r = httpx.post(f"{url}/v1/agent/runs", json={"question": "What?", "background": True, "stream": True},
                       timeout=30)
        assert r.status_code == 400 and "events" in r.json()["error"]["message"]
        r = httpx.post(f"{url}/v1/agent/runs", json={"question": "What?", "background": True, "store": False},
                       timeout=30)
        assert r.status_code == 400


@pytest.fixture(scope="session")
def serve_off(torch_engine: Any, demo_tools: Any) -> Any:
    from ssr_server.bench.serve import live_server
    from ssr_server.core.config import Settings

    return lambda: live_server(Settings(run_store="off"), torch_engine, demo_tools)


def test_the_viewer_files_are_open_and_the_runs_need_the_key(stored: Any, sqlite_url: str) -> None:
    with stored(sqlite_url, api_key="s3cret") as url:
        page = httpx.get(f"{url}/ui/", timeout=30)
        assert page.status_code == 200 and "viewer.js" in page.text
        assert httpx.get(f"{url}/ui/viewer.js", timeout=30).status_code == 200
        assert httpx.get(f"{url}/v1/agent/runs", timeout=30).status_code == 401
        key = {"Authorization": "Bearer s3cret"}
        assert httpx.get(f"{url}/v1/agent/runs", headers=key, timeout=30).json()["data"] == []
        for method, path in (("GET", "/v1/agent/runs/nope/events"), ("POST", "/v1/agent/runs/nope/cancel"),
                             ("GET", "/v1/agent/runs/nope/images/0"), ("DELETE", "/v1/agent/runs/nope")):
            r = httpx.request(method, url + path, headers=key, timeout=30)
            assert r.status_code == 404 and r.json()["error"]["code"] == "run_not_found", (path, r.text)

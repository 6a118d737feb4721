"""The run viewer (/ui) in headless Chromium: what it shows of a real demo run (every turn's six
candidates with S and q, the chosen one marked, the images loaded), the list with its filter and sort,
and a run in flight updating live. Screenshots go under the test's temporary folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx


def _images_loaded(page: Any) -> bool:
    return bool(page.evaluate("() => [...document.images].length > 0"
                              " && [...document.images].every(i => i.complete && i.naturalWidth > 0)"))


def test_the_viewer_shows_a_demo_run_turn_by_turn(browser: Any, shipped: Any, tmp_path: Path,
                                                 demo_question: dict[str, Any]) -> None:
    """The demo world's headline question on the shipped model: every turn's six candidates, the chosen
    one, the input picture loaded."""
    body = {**demo_question, "max_turns": 4}
    with shipped(f"sqlite:///{tmp_path / 'runs.sqlite3'}") as url:
        runs = [httpx.post(f"{url}/v1/agent/runs", json={**body, "seed": s}, timeout=120).json()
                for s in (3, 4)]
        run = httpx.get(f"{url}/v1/agent/runs/{runs[0]['id']}", timeout=30).json()
        libs = {lib["name"]: lib for lib in httpx.get(f"{url}/v1/libraries", timeout=30).json()}
        ids = [c["id"] for c in libs[run["library"]]["candidates"]]
        assert len(ids) == 6
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        try:
            # the list: both runs, newest first, linked
            page.goto(f"{url}/ui/")
            page.wait_for_selector("#runs tbody tr")
            rows = page.locator("#runs tbody tr")
            assert rows.count() == 2
            assert rows.nth(0).get_attribute("data-run") == runs[1]["id"]
            assert body["question"][:60] in rows.nth(1).inner_text()
            page.get_by_role("button", name="Latency").click()  # sort by latency, slowest first
            shown = [float(t.split()[0]) for t in page.locator("#runs td.latency").all_inner_texts()]
            assert shown == sorted(shown, reverse=True)
            page.screenshot(path=str(tmp_path / "viewer-list.png"), full_page=True)
            # the run page
            page.locator(f'tr[data-run="{run["id"]}"] a').click()
            page.wait_for_selector(f'section.turn[data-turn="{len(run["turns"]) - 1}"]')
            assert page.locator("h1").inner_text() == body["question"]
            assert page.locator("#run-status").inner_text() == run["status"]
            turns = page.locator("section.turn")
            assert turns.count() == len(run["turns"]) >= 1
            for i, t in enumerate(run["turns"]):
                card = turns.nth(i)
                cands = card.locator("li.cand")
                assert cands.count() == 6 and not t["left_out"]
                assert [cands.nth(k).get_attribute("data-candidate") for k in range(6)] == ids
                chosen = card.locator("li.cand.chosen")
                assert chosen.count() == 1 and chosen.get_attribute("data-candidate") == t["candidate_id"]
                assert chosen.get_attribute("aria-current") == "true"
                for k in range(6):
                    assert cands.nth(k).locator(".s").inner_text() == f"S {t['scores'][k]:.3f}"
                    assert cands.nth(k).locator(".q").inner_text() == f"q {t['q'][k]:.3f}"
                assert card.locator("pre.action").inner_text().strip() == t["action_text"].strip()
                if t["tool_name"]:
                    assert t["tool_name"] in card.locator(".tool-call").inner_text()
            page.wait_for_function("() => [...document.images].every(i => i.complete && i.naturalWidth > 0)")
            assert _images_loaded(page)
            assert page.locator("img[data-image='0']").count() >= 1
            page.screenshot(path=str(tmp_path / "viewer-run.png"), full_page=True)
        finally:
            page.close()
    assert (tmp_path / "viewer-run.png").stat().st_size > 10_000


def test_a_run_in_flight_updates_live(browser: Any, stored: Any, tmp_path: Path, search: Any,
                                      kit: Any) -> None:
    with stored(f"sqlite:///{tmp_path / 'runs.sqlite3'}", search) as url:
        r = httpx.post(f"{url}/v1/agent/runs", json={**kit.GATED, "max_turns": 3, "background": True},
                       timeout=60)
        run_id = r.json()["id"]
        kit.wait_for(lambda: kit.get_run(url, run_id)["turn_count"] >= 1, what="a turn")
        page = browser.new_page()
        try:
            page.goto(f"{url}/ui/#/runs/{run_id}")
            page.wait_for_selector('section.turn[data-turn="0"]')
            assert page.locator("#run-status").inner_text() == "running"
            assert page.locator("section.turn").count() == 1
            search.open()  # the run goes on: its turns and its end appear without a reload
            page.wait_for_selector('section.turn[data-turn="2"]', timeout=60_000)
            page.wait_for_function("() => document.getElementById('run-status').textContent === 'completed'",
                                   timeout=60_000)
            assert page.get_by_role("status").inner_text().startswith("run completed")
            page.screenshot(path=str(tmp_path / "viewer-live.png"), full_page=True)
        finally:
            page.close()

"""/metrics (Prometheus text, parsed) and /v1/stats after real runs: every histogram exists and each
count grows by exactly what the runs did."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ssr_server.core.metrics import HISTOGRAM_NAMES

Scrape = Callable[[httpx.Client], dict[str, float]]


def delta(before: dict[str, float], after: dict[str, float], key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


def tool_calls(turn: dict[str, Any]) -> str | None:
    """The tool a turn really ran (not an answer, not an action that failed to parse)."""
    if turn["action_type"] == "answer" and turn["error"] is None:
        return None
    if turn["observation"].startswith("Invalid action"):
        return None
    return str(turn["action_type"])


def do_runs(client: httpx.Client, png_b64: str) -> list[dict[str, Any]]:
    bodies: list[dict[str, Any]] = [
        {"question": "What is this landmark?", "images": [png_b64], "tau": 1.0, "seed": s, "max_turns": 3}
        for s in (0, 1, 2, 5)
    ] + [
        {"question": "How tall is it?", "images": [png_b64], "mode": "freeform", "max_turns": 2,
         "reasoning_budget": 6, "seed": s}
        for s in (0, 1)
    ]
    runs = []
    for body in bodies:
        r = client.post("/v1/agent/runs", json=body)
        assert r.status_code == 200, r.text
        runs.append(r.json())
    return runs


def test_metrics_count_what_the_runs_did(client: httpx.Client, png_b64: str, metrics_scrape: Scrape) -> None:
    before = metrics_scrape(client)
    runs = do_runs(client, png_b64)
    after = metrics_scrape(client)

    runs_by_mode = Counter(r["mode"] for r in runs)
    turns_by_mode = Counter(r["mode"] for r in runs for _ in r["turns"])
    for mode in ("ssr", "freeform"):
        m = f'mode="{mode}"'
        for name in ("ssr_run_seconds", "ssr_run_model_seconds", "ssr_run_turns"):
            assert delta(before, after, f"{name}_count{{{m}}}") == runs_by_mode[mode], name
        assert delta(before, after, f"ssr_run_turns_sum{{{m}}}") == turns_by_mode[mode]
        for name in ("ssr_reasoning_seconds", "ssr_action_seconds", "ssr_turn_seconds"):
            assert delta(before, after, f"{name}_count{{{m}}}") == turns_by_mode[mode], name
        model_s = sum(r["timings"]["model_s"] for r in runs if r["mode"] == mode)
        assert abs(delta(before, after, f"ssr_run_model_seconds_sum{{{m}}}") - model_s) < 1e-6
        generated = sum(r["usage"]["generated_tokens"] for r in runs if r["mode"] == mode)
        assert delta(before, after, f"ssr_generated_tokens_total{{{m}}}") == generated
        turns = [t for r in runs if r["mode"] == mode for t in r["turns"]]
        tokens, forwards = sum(t["action_tokens"] for t in turns), sum(t["action_forwards"] for t in turns)
        assert delta(before, after, f"ssr_action_tokens_total{{{m}}}") == tokens
        assert delta(before, after, f"ssr_action_forwards_total{{{m}}}") == forwards
        assert 0 < forwards < tokens  # the first token comes with the prompt

    outcomes = Counter((r["mode"], r["outcome"]) for r in runs)
    for (mode, outcome), n in outcomes.items():
        assert delta(before, after, f'ssr_runs_total{{mode="{mode}",outcome="{outcome}"}}') == n

    chosen = Counter(t["candidate_id"] for r in runs if r["mode"] == "ssr" for t in r["turns"])
    for cand, n in chosen.items():
        key = f'ssr_candidate_selected_total{{candidate="{cand}",library="default"}}'
        assert delta(before, after, key) == n, key

    tools = Counter(tc for r in runs for t in r["turns"] if (tc := tool_calls(t)) is not None)
    assert sum(tools.values()) >= 1
    for tool in ("image_search", "text_search", "zoom"):
        assert delta(before, after, f'ssr_tool_seconds_count{{tool="{tool}"}}') == tools[tool], tool

    scored = sum(r["usage"]["scored_tokens"] for r in runs)
    assert delta(before, after, "ssr_scored_tokens_total{}") == scored
    assert after["ssr_runs_in_flight{}"] == 0


def test_every_histogram_is_exposed_with_consistent_buckets(client: httpx.Client, png_b64: str) -> None:
    do_runs(client, png_b64)  # the tool histogram has samples only once a tool has run
    text = client.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in HISTOGRAM_NAMES:
        assert name in families, name
        fam = families[name]
        assert fam.type == "histogram"
        series: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
        for s in fam.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            entry = series.setdefault(labels, {"buckets": []})
            if s.name.endswith("_bucket"):
                entry["buckets"].append((float(s.labels["le"]), s.value))
            elif s.name.endswith("_count"):
                entry["count"] = s.value
            elif s.name.endswith("_sum"):
                entry["sum"] = s.value
        assert series, f"{name} has no series"
        for labels, entry in series.items():
            buckets = sorted(entry["buckets"])
            assert buckets[-1][0] == float("inf")
            counts = [c for _, c in buckets]
            assert counts == sorted(counts), (name, labels)  # cumulative
            assert buckets[-1][1] == entry["count"] > 0
            assert entry["sum"] >= 0
    for counter in ("ssr_runs", "ssr_candidate_selected", "ssr_scored_tokens", "ssr_generated_tokens",
                    "ssr_requests_rejected"):
        assert counter in families and families[counter].type == "counter", counter
    for gauge in ("ssr_runs_in_flight", "ssr_engine_ready"):
        assert families[gauge].type == "gauge"


def test_select_counts_the_library_label(client: httpx.Client, metrics_scrape: Scrape) -> None:
    libs = [lib["name"] for lib in client.get("/v1/libraries").json()]
    name = next(n for n in sorted(libs) if n != "default")
    before = metrics_scrape(client)
    sel = client.post("/v1/ssr/select", json={"messages": [{"role": "user", "content": "Hi?"}],
                                              "library": name}).json()
    custom = client.post("/v1/ssr/select", json={"messages": [{"role": "user", "content": "Hi?"}],
                                                 "candidates": ["Look closer.", "Answer."]}).json()
    after = metrics_scrape(client)
    key = f'ssr_candidate_selected_total{{candidate="{sel["candidate_id"]}",library="{name}"}}'
    assert delta(before, after, key) == 1
    key = f'ssr_candidate_selected_total{{candidate="{custom["candidate_id"]}",library="custom"}}'
    assert delta(before, after, key) == 1
    assert delta(before, after, "ssr_scored_tokens_total{}") == sum(sel["token_counts"]) + sum(
        custom["token_counts"])


def test_ready_sets_the_engine_gauge(client: httpx.Client, metrics_scrape: Scrape) -> None:
    assert client.get("/ready").status_code == 200
    assert metrics_scrape(client)["ssr_engine_ready{}"] == 1


def test_stats_percentiles_per_mode(client: httpx.Client, png_b64: str) -> None:
    before = client.get("/v1/stats").json()
    runs = do_runs(client, png_b64)
    r = client.get("/v1/stats")
    assert r.status_code == 200
    stats = r.json()
    assert stats["window"] >= 10
    for mode in ("ssr", "freeform"):
        m = stats["modes"][mode]
        n_runs = sum(x["mode"] == mode for x in runs)
        n_turns = sum(len(x["turns"]) for x in runs if x["mode"] == mode)
        prev = before.get("modes", {}).get(mode, {})
        for series in ("reasoning_s", "action_s", "turn_s", "run_s", "model_s"):
            s = m[series]
            assert set(s) == {"count", "mean", "p50", "p95", "p99", "max"}
            assert 0 < s["p50"] <= s["p95"] <= s["p99"] <= s["max"]
            assert 0 < s["mean"] <= s["max"]
            grew = s["count"] - prev.get(series, {}).get("count", 0)
            assert grew == (n_runs if series in ("run_s", "model_s") else n_turns), series
        outcomes = Counter(x["outcome"] for x in runs if x["mode"] == mode)
        for outcome, n in outcomes.items():
            assert m["outcomes"][outcome] - prev.get("outcomes", {}).get(outcome, 0) == n

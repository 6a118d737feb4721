"""The spans a traced server exports over OTLP/HTTP (decoded from the protobuf it sends), for each kind
of work: an SSR run with tools, a freeform run, a chat completion, one selection step, a failing tool; a
caller's ``traceparent``; the trace ids passed on to a tool backend; the times adding up."""

from __future__ import annotations

from typing import Any

import pytest
from otel_parts import SpanRec, Traced, children, one

SERVER, CLIENT = 2, 3  # OTLP span kinds
ERROR = 2  # OTLP status code


def run(traced: Traced, body: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
    r = traced.client().post("/v1/agent/runs", json=body, headers=headers or {})
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def check_run_tree(spans: list[SpanRec], out: dict[str, Any]) -> tuple[SpanRec, list[SpanRec]]:
    """The shape every run has: server span -> ssr.run -> one ssr.turn per turn, in order."""
    server = next(s for s in spans if s.kind == SERVER)
    assert server.attributes.get("http.route") == "/v1/agent/runs"
    root = one(spans, "ssr.run")
    assert root.parent == server.span_id
    assert root.attributes["ssr.run_id"] == out["id"]
    assert root.attributes["ssr.mode"] == out["mode"]
    assert root.attributes["ssr.library"] == out["library"]
    assert root.attributes["ssr.outcome"] == out["outcome"]
    assert root.attributes["ssr.turns"] == len(out["turns"])
    assert root.service == "ssr-server-under-test"
    turns = children(spans, root, "ssr.turn")
    assert [t.attributes["ssr.turn.index"] for t in turns] == list(range(len(out["turns"])))
    return root, turns


def test_ssr_run_is_one_trace_of_turns_selections_actions_and_tools(
        traced: Traced, demo_png_b64: str) -> None:
    out = run(traced, {"question": "What is this landmark and how tall is it?", "images": [demo_png_b64],
                       "tau": 1.0, "seed": 0, "max_turns": 4})
    spans = traced.receiver.trace_of_run(out["id"])
    _, turns = check_run_tree(spans, out)
    tools_run = 0
    for span, turn in zip(turns, out["turns"], strict=True):
        select = children(spans, span, "ssr.select")
        assert len(select) == 1
        a = select[0].attributes
        assert a["ssr.select.chosen"] == turn["candidate_id"]
        assert a["ssr.select.candidates"] == len(turn["scores"])
        i = turn["scores"].index(a["ssr.select.score"])
        assert a["ssr.select.q"] == pytest.approx(turn["q"][i])
        assert a["ssr.select.max_q"] == pytest.approx(max(turn["q"]))
        assert a["ssr.scored_tokens"] == turn["scored_tokens"]
        assert a["ssr.cached_tokens"] == turn["cached_tokens"]
        action = children(spans, span, "ssr.action")
        assert len(action) == 1
        assert action[0].attributes["ssr.action.type"] == turn["action_type"]
        assert action[0].attributes["ssr.action.tokens"] == turn["action_tokens"]
        assert action[0].attributes["ssr.action.forwards"] == turn.get("action_forwards", 0)
        tool = children(spans, span, "ssr.tool")
        if turn["tool_s"] > 0:  # the tool ran
            tools_run += 1
            assert len(tool) == 1
            assert tool[0].attributes["ssr.tool.name"] == turn["action_type"]
            assert tool[0].attributes["ssr.tool.outcome"] == ("ok" if turn["observation_ok"] else "error")
            assert tool[0].attributes["ssr.tool.result_chars"] == len(turn["observation"])
        else:
            assert tool == []
        assert select[0].end_ns <= action[0].start_ns
    assert out["outcome"] == "answered" or tools_run > 0


def test_the_spans_of_a_turn_add_up_to_the_turn_and_the_turns_to_the_run(
        traced: Traced, demo_png_b64: str) -> None:
    out = run(traced, {"question": "Which landmark is this?", "images": [demo_png_b64], "tau": 1.0,
                       "seed": 6, "max_turns": 4})
    spans = traced.receiver.trace_of_run(out["id"])
    root, turns = check_run_tree(spans, out)
    for span in turns:
        parts = children(spans, span)
        assert {p.name for p in parts} <= {"ssr.select", "ssr.action", "ssr.tool"}
        inside = sum(p.seconds for p in parts)
        assert inside <= span.seconds
        assert inside >= 0.95 * span.seconds, (span.seconds, [(p.name, p.seconds) for p in parts])
        assert root.start_ns <= span.start_ns and span.end_ns <= root.end_ns
    assert sum(t.seconds for t in turns) <= root.seconds


def test_freeform_run_thinks_instead_of_selecting(traced: Traced, demo_png_b64: str) -> None:
    out = run(traced, {"question": "How tall is it?", "images": [demo_png_b64], "mode": "freeform",
                       "max_turns": 2, "reasoning_budget": 6, "seed": 0})
    spans = traced.receiver.trace_of_run(out["id"])
    _, turns = check_run_tree(spans, out)
    assert not [s for s in spans if s.name == "ssr.select"]
    for span, turn in zip(turns, out["turns"], strict=True):
        think = children(spans, span, "ssr.think")
        assert len(think) == 1
        assert think[0].attributes["ssr.think.tokens"] == turn["reasoning_tokens"]
        assert len(children(spans, span, "ssr.action")) == 1


def test_chat_completion_has_the_run_shape_of_one_turn(traced: Traced) -> None:
    c = traced.client()
    model = c.get("/v1/models").json()["data"][0]["id"]
    r = c.post("/v1/chat/completions", json={
        "model": model, "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 8, "seed": 1})
    assert r.status_code == 200, r.text
    reasoning = r.json()["choices"][0]["message"].get("reasoning_content")

    def found(spans: list[SpanRec]) -> list[SpanRec]:
        runs = [s for s in spans if s.name == "ssr.run"
                and s.attributes.get("ssr.route") == "chat.completions"]
        if not runs:
            return []
        trace = [s for s in spans if s.trace_id == runs[-1].trace_id]
        return trace if any(s.kind == SERVER for s in trace) else []

    spans = traced.receiver.wait(found)
    server = next(s for s in spans if s.kind == SERVER)
    assert server.attributes.get("http.route") == "/v1/chat/completions"
    root = one(spans, "ssr.run")
    assert root.parent == server.span_id
    assert root.attributes["ssr.outcome"] in ("answered", "tool_calls")
    assert root.attributes["ssr.turns"] == 1
    turn = one(spans, "ssr.turn")
    assert turn.parent == root.span_id
    select = one(spans, "ssr.select")
    assert select.parent == turn.span_id
    assert one(spans, "ssr.action").parent == turn.span_id
    assert not [s for s in spans if s.name == "ssr.tool"]  # the client runs its tools
    assert reasoning is None or isinstance(reasoning, str)


def test_selection_step_exports_the_same_select_span(traced: Traced) -> None:
    r = traced.client().post("/v1/ssr/select", json={
        "messages": [{"role": "user", "content": "Where is the Eiffel Tower?"}], "tau": 1.0, "seed": 2})
    assert r.status_code == 200, r.text
    out = r.json()

    def found(spans: list[SpanRec]) -> list[SpanRec]:
        servers = [s for s in spans
                   if s.kind == SERVER and s.attributes.get("http.route") == "/v1/ssr/select"]
        return [s for s in spans if servers and s.trace_id == servers[-1].trace_id]

    spans = traced.receiver.wait(found)
    server = next(s for s in spans if s.kind == SERVER)
    select = one(spans, "ssr.select")
    assert select.parent == server.span_id
    assert select.attributes["ssr.select.chosen"] == out["candidate_id"]
    assert select.attributes["ssr.select.q"] == pytest.approx(out["q"][out["index"]])
    assert select.attributes["ssr.select.candidates"] == len(out["scores"])
    assert select.attributes["ssr.scored_tokens"] == sum(out["token_counts"])


def test_failing_tool_span_is_an_error_and_the_backend_gets_the_trace(
        traced: Traced, demo_png_b64: str) -> None:
    traced.searx.fail = True
    try:
        seen = len(traced.searx.traceparents)
        out = run(traced, {"question": "How tall is the Eiffel Tower?", "library": "search-only",
                           "max_turns": 1, "seed": 0})
    finally:
        traced.searx.fail = False
    assert out["turns"][0]["action_type"] == "text_search"
    assert out["turns"][0]["observation_ok"] is False
    spans = traced.receiver.trace_of_run(out["id"])
    _, turns = check_run_tree(spans, out)
    tool = children(spans, turns[0], "ssr.tool")
    assert len(tool) == 1
    assert tool[0].status == ERROR
    assert tool[0].attributes["ssr.tool.name"] == "text_search"
    assert tool[0].attributes["ssr.tool.outcome"] == "error"
    # the backend call is an httpx client span under the tool span, and its traceparent names it
    (client,) = children(spans, tool[0])
    assert client.kind == CLIENT
    status = client.attributes.get("http.response.status_code", client.attributes.get("http.status_code"))
    assert status == 500
    assert client.status == ERROR
    headers = traced.searx.traceparents[seen:]
    assert headers and all(h is not None for h in headers)
    version, trace_id, parent_id, _ = str(headers[0]).split("-")
    assert (version, trace_id, parent_id) == ("00", client.trace_id, client.span_id)


def test_callers_traceparent_parents_the_server_span(traced: Traced, demo_png_b64: str) -> None:
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    out = run(traced, {"question": "What is this?", "images": [demo_png_b64], "max_turns": 1, "seed": 4},
              headers={"traceparent": f"00-{trace_id}-{parent_id}-01"})
    spans = traced.receiver.trace_of_run(out["id"])
    assert {s.trace_id for s in spans} == {trace_id}
    server = next(s for s in spans if s.kind == SERVER)
    assert server.parent == parent_id
    check_run_tree(spans, out)

"""Prometheus metrics, defined once.

Latency buckets run from 1 ms to 60 s, dense between 5 and 100 ms so that a 5-100 ms p95 (the SSR
reasoning step on a GPU) is resolved to a few milliseconds by ``histogram_quantile``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ssr_server.core import tracing

LATENCY_BUCKETS: tuple[float, ...] = (
    0.001, 0.002, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09,
    0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0,
    30.0, 45.0, 60.0,
)
TURN_BUCKETS: tuple[float, ...] = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20)

REGISTRY = CollectorRegistry(auto_describe=True)

REASONING_SECONDS = Histogram(
    "ssr_reasoning_seconds", "Per-turn reasoning latency: scoring+selection (ssr) or decoding it (freeform)",
    ["mode"], buckets=LATENCY_BUCKETS, registry=REGISTRY,
)
ACTION_SECONDS = Histogram(
    "ssr_action_seconds", "Per-turn action decoding latency", ["mode"], buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
TOOL_SECONDS = Histogram(
    "ssr_tool_seconds", "Tool call latency", ["tool"], buckets=LATENCY_BUCKETS, registry=REGISTRY,
)
TURN_SECONDS = Histogram(
    "ssr_turn_seconds", "Whole turn latency (reasoning, action, tool)", ["mode"], buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
RUN_SECONDS = Histogram(
    "ssr_run_seconds", "Whole run latency, end to end", ["mode"], buckets=LATENCY_BUCKETS, registry=REGISTRY,
)
RUN_MODEL_SECONDS = Histogram(
    "ssr_run_model_seconds", "Model time per question (reasoning + action, no tools)", ["mode"],
    buckets=LATENCY_BUCKETS, registry=REGISTRY,
)
RUN_TURNS = Histogram(
    "ssr_run_turns", "Turns per run", ["mode"], buckets=TURN_BUCKETS, registry=REGISTRY,
)
CANDIDATE_SELECTED = Counter(
    "ssr_candidate_selected_total", "Rationale candidates chosen", ["library", "candidate"],
    registry=REGISTRY,
)
RUNS = Counter("ssr_runs_total", "Runs finished, by outcome", ["mode", "outcome"], registry=REGISTRY)
SCORED_TOKENS = Counter(
    "ssr_scored_tokens_total", "Candidate tokens scored (teacher-forced)", registry=REGISTRY,
)
GENERATED_TOKENS = Counter(
    "ssr_generated_tokens_total", "Tokens decoded (reasoning in freeform mode, and actions)", ["mode"],
    registry=REGISTRY,
)
ACTION_TOKENS = Counter(
    "ssr_action_tokens_total", "Action tokens decoded (tool-call arguments and answers)", ["mode"],
    registry=REGISTRY,
)
ACTION_FORWARDS = Counter(
    "ssr_action_forwards_total", "Decode forwards spent on actions (tokens per forward: "
    "ssr_action_tokens_total / this; above 1 with jump-forward and prompt lookup)", ["mode"],
    registry=REGISTRY,
)
RUNS_IN_FLIGHT = Gauge("ssr_runs_in_flight", "Runs being served now", registry=REGISTRY)
REQUESTS_REJECTED = Counter(
    "ssr_requests_rejected_total", "Requests refused before running, by reason", ["reason"],
    registry=REGISTRY,
)
ENGINE_READY = Gauge("ssr_engine_ready", "1 when the engine answers its readiness probe", registry=REGISTRY)



def observe_turn(mode: str, reasoning_s: float, action_s: float, turn_s: float,
                 generated_tokens: int) -> None:
    """One turn's latencies and decoded tokens (the agent loop and the OpenAI route alike), with the
    turn's span as exemplar when it is traced."""
    ex = tracing.exemplar()
    REASONING_SECONDS.labels(mode=mode).observe(reasoning_s, ex)
    ACTION_SECONDS.labels(mode=mode).observe(action_s, ex)
    TURN_SECONDS.labels(mode=mode).observe(turn_s, ex)
    GENERATED_TOKENS.labels(mode=mode).inc(generated_tokens)


def observe_action(mode: str, tokens: int, forwards: int) -> None:
    """One action's decoded tokens and the decode forwards they took."""
    ACTION_TOKENS.labels(mode=mode).inc(tokens)
    ACTION_FORWARDS.labels(mode=mode).inc(forwards)


def observe_run(mode: str, outcome: str, total_s: float, model_s: float, turns: int) -> None:
    """One finished run (the agent loop's, or a chat completion: a run of one turn)."""
    ex = tracing.exemplar()
    RUNS.labels(mode=mode, outcome=outcome).inc()
    RUN_SECONDS.labels(mode=mode).observe(total_s, ex)
    RUN_MODEL_SECONDS.labels(mode=mode).observe(model_s, ex)
    RUN_TURNS.labels(mode=mode).observe(turns)


HISTOGRAM_NAMES: tuple[str, ...] = (
    "ssr_reasoning_seconds", "ssr_action_seconds", "ssr_tool_seconds", "ssr_turn_seconds",
    "ssr_run_seconds", "ssr_run_model_seconds", "ssr_run_turns",
)

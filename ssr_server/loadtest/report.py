"""Summaries of a load: counts, throughput, goodput, latency percentiles per mode; JSON, PNG and a table.

Definitions (all over the requests of one ``LoadResult``):

* ``completed``: HTTP 200 with a run in the body, whatever the run's outcome; ``refused``: 429/503;
  ``failed``: everything else (other statuses, transport errors, client timeouts, cancelled at the end);
* ``span_s``: from the first request's start to the last one's end; ``throughput_rps``: completed runs
  per second of span;
* ``goodput_rps``: completed runs with outcome ``answered`` or ``max_turns`` whose latency is at most
  ``slo_s``, per second of span;
* latency (``latency_s``): client-side send -> response of completed runs; ``reasoning_s``: the server's
  per-turn reasoning time (the selection step in ssr mode, the decoded reasoning in freeform);
  ``model_s``: the server's reasoning + action time per question (the paper's latency measure).
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ssr_server.core.summary import percentiles
from ssr_server.loadtest.records import LoadResult, RequestRecord

__all__ = ["GOOD_OUTCOMES", "format_table", "percentiles", "summarize", "timeline", "write_json", "write_png",
           "write_report"]

GOOD_OUTCOMES = frozenset({"answered", "max_turns"})


def _span(records: Sequence[RequestRecord]) -> float:
    if not records:
        return 0.0
    return max(r.end_s for r in records) - min(r.start_s for r in records)


def _good(r: RequestRecord, slo_s: float) -> bool:
    return r.fate == "completed" and r.outcome in GOOD_OUTCOMES and r.latency_s <= slo_s


def _group(records: Sequence[RequestRecord], span: float, slo_s: float) -> dict[str, Any]:
    done = [r for r in records if r.fate == "completed"]
    fates = Counter(r.fate for r in records)
    good = sum(1 for r in records if _good(r, slo_s))
    return {
        "sent": len(records),
        "completed": fates.get("completed", 0),
        "failed": fates.get("failed", 0),
        "refused": fates.get("refused", 0),
        "throughput_rps": len(done) / span if span > 0 else 0.0,
        "goodput_rps": good / span if span > 0 else 0.0,
        "within_slo": good,
        "outcomes": dict(Counter(r.outcome or "-" for r in done)),
        "latency_s": percentiles([r.latency_s for r in done]),
        "reasoning_s": percentiles([x for r in done for x in r.reasoning_s]),
        "model_s": percentiles([r.model_s for r in done if r.model_s is not None], qs=(50, 95)),
        "turns_mean": float(np.mean([r.turns for r in done])) if done else None,
        "first_turn_s": percentiles([r.first_turn_s for r in done if r.first_turn_s is not None]),
    }


def timeline(records: Sequence[RequestRecord], bin_s: float = 1.0) -> list[dict[str, float]]:
    """Completions per second in bins of ``bin_s`` seconds from the start of the load."""
    ends = [r.end_s for r in records if r.fate == "completed"]
    if not ends:
        return []
    n = math.floor(max(ends) / bin_s) + 1
    counts = np.bincount(np.floor(np.asarray(ends) / bin_s).astype(int), minlength=n)
    return [{"t_s": i * bin_s, "completions": int(c), "rps": float(c) / bin_s} for i, c in enumerate(counts)]


def summarize(result: LoadResult, slo_s: float | None = None, bin_s: float = 1.0) -> dict[str, Any]:
    """Everything the report shows, as plain JSON-able data."""
    slo = float(slo_s if slo_s is not None else result.config.get("slo_s", 10.0))
    recs = result.records
    span = _span(recs)
    overall = _group(recs, span, slo)
    modes = sorted({r.mode for r in recs})
    errors = Counter(r.error or f"status {r.status}" for r in recs if r.fate != "completed")
    retry = [r.retry_after_s for r in recs if r.retry_after_s is not None]
    summary: dict[str, Any] = {
        "target": result.target,
        "loop": result.loop,
        "config": result.config,
        "slo_s": slo,
        "elapsed_s": result.elapsed_s,
        "span_s": span,
        "launch_window_s": result.launch_window_s,
        "offered_rps": result.sent / result.launch_window_s if result.launch_window_s > 0 else None,
        "cap_waits": result.cap_waits,
        "cancelled_at_end": result.cancelled_at_end,
        **overall,
        "sched_latency_s": percentiles([r.sched_latency_s for r in recs if r.fate == "completed"]),
        "retry_after_s": percentiles(retry),
        "errors": dict(errors.most_common(10)),
        "modes": {m: _group([r for r in recs if r.mode == m], span, slo) for m in modes},
        "timeline": timeline(recs, bin_s),
    }
    return summary


# ---- output -----------------------------------------------------------------------------------------
def write_json(summary: dict[str, Any], path: str | os.PathLike[str], result: LoadResult | None = None,
               ) -> Path:
    """The summary (and, given ``result``, every request's record) as indented JSON."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    data = dict(summary)
    if result is not None:
        data["records"] = [r.to_dict() for r in result.records]
    out.write_text(json.dumps(data, indent=1, allow_nan=False, default=_json_default))
    return out


def _json_default(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def write_png(result: LoadResult, summary: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Two panels: the latency CDF per mode, and completions per second over time."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    try:
        for mode in sorted(summary["modes"]):
            lat = np.sort([r.latency_s for r in result.records if r.mode == mode and r.fate == "completed"])
            if lat.size:
                ax1.step(lat, np.arange(1, lat.size + 1) / lat.size, where="post",
                         label=f"{mode} (n={lat.size})")
        ax1.axvline(summary["slo_s"], color="grey", linestyle="--", linewidth=1,
                    label=f"SLO {summary['slo_s']:g} s")
        ax1.set_xlabel("run latency (s)")
        ax1.set_ylabel("fraction of completed runs")
        ax1.set_ylim(0, 1.02)
        ax1.set_title("run latency CDF per mode")
        ax1.grid(alpha=0.3)
        ax1.legend(loc="lower right")
        tl = summary["timeline"]
        if tl:
            bin_s = tl[1]["t_s"] - tl[0]["t_s"] if len(tl) > 1 else 1.0
            ax2.bar([b["t_s"] for b in tl], [b["rps"] for b in tl], width=bin_s, align="edge",
                    alpha=0.7, label="completions/s")
            ax2.axhline(summary["throughput_rps"], color="C3", linestyle="--", linewidth=1,
                        label=f"mean {summary['throughput_rps']:.2f}/s")
            ax2.legend(loc="upper right")
        ax2.set_xlabel("time since start (s)")
        ax2.set_ylabel("completed runs per second")
        ax2.set_title("throughput over time")
        ax2.grid(alpha=0.3)
        what = (f"rate {result.config['rate']}/s" if result.loop == "open"
                else f"concurrency {result.config['concurrency']}")
        fig.suptitle(f"{result.target}: {what}, {summary['completed']}/{summary['sent']} completed, "
                     f"{summary['refused']} refused, {summary['failed']} failed")
        fig.tight_layout()
        fig.savefig(out, dpi=110)
    finally:
        plt.close(fig)
    return out


def write_report(result: LoadResult, out_dir: str | os.PathLike[str], slo_s: float | None = None,
                 stem: str = "loadtest", include_records: bool = True) -> tuple[dict[str, Any], Path, Path]:
    """Summarise, then write ``<out_dir>/<stem>.json`` and ``<out_dir>/<stem>.png``."""
    summary = summarize(result, slo_s)
    d = Path(out_dir)
    js = write_json(summary, d / f"{stem}.json", result if include_records else None)
    png = write_png(result, summary, d / f"{stem}.png")
    return summary, js, png


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.0f}"


def format_table(summary: dict[str, Any]) -> str:
    """A plain-text report: totals, then one row per mode (latencies in milliseconds)."""
    cfg = summary["config"]
    what = f"open loop {cfg['rate']}/s" if summary["loop"] == "open" else f"closed loop x{cfg['concurrency']}"
    lines = [
        f"target {summary['target']}  {what}  span {summary['span_s']:.1f} s  SLO {summary['slo_s']:g} s",
        f"sent {summary['sent']}  completed {summary['completed']}  failed {summary['failed']}  "
        f"refused {summary['refused']}  throughput {summary['throughput_rps']:.2f} runs/s  "
        f"goodput {summary['goodput_rps']:.2f} runs/s",
    ]
    if summary.get("offered_rps"):
        lines.append(f"offered {summary['offered_rps']:.2f} req/s  in-flight cap waits {summary['cap_waits']}"
                     f"  cancelled at end {summary['cancelled_at_end']}")
    head = (f"{'mode':<9} {'done':>5} {'fail':>5} {'refu':>5} {'runs/s':>7} {'good/s':>7} "
            f"{'lat p50':>8} {'p95':>7} {'p99':>7} {'reas p50':>9} {'p95':>6} {'p99':>6} "
            f"{'model p50':>10} {'p95':>7} {'turns':>6}")
    lines += ["", head, "-" * len(head)]
    rows = [*summary["modes"].items(), ("all", summary)]
    for name, g in rows:
        lat, rea, mod = g["latency_s"], g["reasoning_s"], g["model_s"]
        turns = "-" if g["turns_mean"] is None else f"{g['turns_mean']:.2f}"
        lines.append(
            f"{name:<9} {g['completed']:>5} {g['failed']:>5} {g['refused']:>5} {g['throughput_rps']:>7.2f} "
            f"{g['goodput_rps']:>7.2f} {_ms(lat['p50']):>8} {_ms(lat['p95']):>7} {_ms(lat['p99']):>7} "
            f"{_ms(rea['p50']):>9} {_ms(rea['p95']):>6} {_ms(rea['p99']):>6} "
            f"{_ms(mod['p50']):>10} {_ms(mod['p95']):>7} {turns:>6}")
    lines.append("(latencies in ms: lat = run latency seen by the client, reas = per-turn reasoning, "
                 "model = reasoning + action per question)")
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(summary["outcomes"].items()))
    if outcomes:
        lines.append(f"outcomes: {outcomes}")
    if summary["errors"]:
        lines.append("errors:")
        lines += [f"  {n:>4} x {msg[:120]}" for msg, n in summary["errors"].items()]
    return "\n".join(lines)


__all__ = ["format_table", "percentiles", "summarize", "timeline", "write_json", "write_png", "write_report"]

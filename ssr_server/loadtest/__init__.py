"""Load testing the agent endpoint: an async open/closed-loop generator and its report.

``run_loadtest`` is the one-call entry point (used by ``ssr-server loadtest``): run a bounded load
against a loopback server, write ``<out_dir>/loadtest.json`` and ``.png``, and return the summary.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ssr_server.loadtest.generator import run_load
from ssr_server.loadtest.records import LoadResult, RequestRecord
from ssr_server.loadtest.report import format_table, summarize, write_json, write_png, write_report
from ssr_server.loadtest.target import RemoteTargetError, check_target, is_loopback
from ssr_server.loadtest.workload import Workload


def parse_mix(spec: str) -> dict[str, float]:
    """``"ssr=0.5,freeform=0.5"`` (or ``"ssr"``) -> ``{"ssr": 0.5, "freeform": 0.5}``."""
    mix: dict[str, float] = {}
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        name, sep, weight = part.partition("=")
        try:
            mix[name.strip()] = float(weight) if sep else 1.0
        except ValueError:
            raise ValueError(f"bad mode weight in {spec!r}: {part!r}") from None
    if not mix:
        raise ValueError("empty mode mix")
    return mix


def run_loadtest(
    target: str = "http://127.0.0.1:8000",
    *,
    rate: float | None = None,
    concurrency: int | None = None,
    requests: int = 100,
    duration_s: float = 60.0,
    modes: Mapping[str, float] | str = "ssr=0.5,freeform=0.5",
    with_images: float = 1.0,
    max_turns: int = 4,
    timeout_s: float = 120.0,
    slo_s: float = 10.0,
    seed: int = 0,
    api_key: str | None = None,
    progress: bool = True,
    tau: float = 1.0,
    stream: bool = False,
    allow_remote: bool = False,
    out_dir: str | Path | None = "loadtest-out",
) -> tuple[dict[str, Any], LoadResult]:
    """Run the load (synchronously), write the report files when ``out_dir`` is set, return both.

    Neither ``rate`` nor ``concurrency`` given: a closed loop of 4 clients. ``summary["json_path"]``
    and ``summary["png_path"]`` name the files written.
    """
    if rate is None and concurrency is None:
        concurrency = 4
    mix = parse_mix(modes) if isinstance(modes, str) else dict(modes)
    result = asyncio.run(run_load(
        target, rate=rate, concurrency=concurrency, requests=requests, duration_s=duration_s, modes=mix,
        with_images=with_images, max_turns=max_turns, timeout_s=timeout_s, slo_s=slo_s, seed=seed,
        api_key=api_key, progress=progress, tau=tau, stream=stream, allow_remote=allow_remote))
    if out_dir is None:
        return summarize(result, slo_s), result
    summary, js, png = write_report(result, out_dir, slo_s)
    summary["json_path"], summary["png_path"] = str(js), str(png)
    return summary, result


__all__ = ["LoadResult", "RemoteTargetError", "RequestRecord", "Workload", "check_target", "format_table",
           "is_loopback", "parse_mix", "run_load", "run_loadtest", "summarize", "write_json", "write_png",
           "write_report"]

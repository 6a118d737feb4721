"""Probes and metrics, for orchestrators and scrapers rather than for clients of the model: liveness,
readiness (the engine answers and the server is not draining, so a load balancer stops sending before
a shutdown), Prometheus, and latency percentiles for people without Prometheus."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.exposition import choose_encoder

from ssr_server.api.state import app_state
from ssr_server.core import metrics

READY_TIMEOUT_S = 5.0  # a probe that hangs is worse than one that fails

router = APIRouter()


@router.get("/health", tags=["ops"])
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/ready", tags=["ops"], responses={503: {"description": "engine not ready"}})
async def ready(request: Request) -> Response:
    st = app_state(request)
    try:
        async with asyncio.timeout(READY_TIMEOUT_S):
            ok = await st.engine.ready()
    except Exception:
        ok = False
    ok = ok and not st.admission.draining
    metrics.ENGINE_READY.set(1 if ok else 0)
    body = {"ready": ok, "engine": st.engine.name, "draining": st.admission.draining,
            "runs_in_flight": st.admission.running, "runs_queued": st.admission.queued}
    return Response(json.dumps(body), status_code=200 if ok else 503, media_type="application/json")


@router.get("/metrics", tags=["ops"])
async def prometheus_metrics(request: Request) -> Response:
    accept = request.headers.get("accept", "")
    if "application/openmetrics-text" in accept:
        # OpenMetrics, the only exposition that carries exemplars (the trace ids of sampled observations)
        encode, content_type = choose_encoder(accept)
        return Response(encode(metrics.REGISTRY), headers={"Content-Type": content_type})
    return Response(generate_latest(metrics.REGISTRY), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/stats", tags=["ops"])
async def stats(request: Request) -> dict[str, Any]:
    return app_state(request).stats.snapshot()


__all__ = ["router"]

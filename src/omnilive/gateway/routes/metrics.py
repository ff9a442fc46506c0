"""``GET /metrics``: Prometheus text format; ``GET /api/admin/live``: the last
minutes per worker and each session's context, for the admin page's charts
(both admin only, see ``gateway/access.py``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from omnilive.gateway.metrics import CONTENT_TYPE, GatewayMetrics

router = APIRouter()


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    registry: GatewayMetrics = request.app.state.metrics
    gateway = getattr(request.app.state, "gateway", None)
    return Response(registry.render(gateway), media_type=CONTENT_TYPE)


@router.get("/api/admin/live")
async def live(request: Request) -> dict[str, Any]:
    """Samples of the last minutes: per worker its slots in use, unit latency
    p50 / p95 and dropped chunks, and the queue's length and oldest wait; and
    each duplex session's context now (``contexts``)."""
    registry: GatewayMetrics = request.app.state.metrics
    return registry.live.to_json()

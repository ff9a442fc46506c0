"""``GET /metrics``: Prometheus text format (admin only, see ``gateway/access.py``)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from omnilive.gateway.metrics import CONTENT_TYPE, GatewayMetrics

router = APIRouter()


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    registry: GatewayMetrics = request.app.state.metrics
    gateway = getattr(request.app.state, "gateway", None)
    return Response(registry.render(gateway), media_type=CONTENT_TYPE)

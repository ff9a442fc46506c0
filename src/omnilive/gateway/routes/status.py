"""Health, status and the worker list."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from omnilive.gateway.scheduler import WorkerHealth
from omnilive.gateway.state import gateway_of

router = APIRouter()


@router.get("/health")
async def health() -> dict[str, Any]:
    """Liveness of the gateway process itself."""
    return {"status": "healthy", "timestamp": time.time()}


@router.get("/status")
async def status(request: Request) -> JSONResponse:
    """Worker counts by state and the queue; 503 while no worker can serve."""
    gateway = gateway_of(request)
    workers = [link.describe() for link in gateway.links.values()]
    scheduler = gateway.pool.scheduler
    ready = any(w.health is WorkerHealth.READY for w in scheduler.workers.values())
    body = {
        "status": "ready" if ready else "unavailable",
        "engine": gateway.engine_name(),
        "capabilities": (caps.to_dict() if (caps := gateway.capabilities()) else None),
        "workers": {
            "total": len(workers),
            "by_state": dict(Counter(w["status"] for w in workers)),
            "slots_total": sum(w["slots"] for w in workers),
            "slots_busy": sum(w["slots_busy"] for w in workers),
        },
        "queue_length": len(scheduler.queue),
        "max_queue_size": scheduler.max_queue_size,
        "running_tasks": scheduler.running(),
        "uptime_s": round(time.time() - gateway.started_at, 1),
    }
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get("/workers")
async def workers(request: Request) -> dict[str, Any]:
    gateway = gateway_of(request)
    restarts = gateway.supervisor.restarts if gateway.supervisor else {}
    return {
        "workers": [
            {**link.describe(), "restarts": restarts.get(worker_id, 0)}
            for worker_id, link in gateway.links.items()
        ]
    }

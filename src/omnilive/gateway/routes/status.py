"""Health, status and the worker list."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from omnilive.clock import iso_or_none
from omnilive.config import reference_name
from omnilive.gateway.routes.queue import shown, suspension
from omnilive.gateway.scheduler import WorkerHealth
from omnilive.gateway.state import gateway_of

router = APIRouter()


@router.get("/health")
async def health() -> dict[str, Any]:
    """Liveness of the gateway process itself."""
    return {"status": "healthy", "timestamp": time.time()}


# The reference's /status counts workers in these groups of states.
_STATUS_GROUPS = {
    "idle_workers": ("idle",),
    "busy_workers": ("busy_chat", "busy_half_duplex"),
    "duplex_workers": ("duplex_active", "duplex_paused"),
    "loading_workers": ("loading",),
    "error_workers": ("error",),
    "offline_workers": ("offline",),
}


@router.get("/status")
async def status(request: Request) -> JSONResponse:
    """Worker counts by state and the queue; 503 while no worker can serve."""
    gateway = gateway_of(request)
    workers = [link.describe() for link in gateway.links.values()]
    scheduler = gateway.pool.scheduler
    ready = any(w.health is WorkerHealth.READY for w in scheduler.workers.values())
    by_state = Counter(w["status"] for w in workers)
    body = {
        "status": "ready" if ready else "unavailable",
        "gateway_healthy": True,
        "total_workers": len(workers),
        **{name: sum(by_state[s] for s in states) for name, states in _STATUS_GROUPS.items()},
        "engine": gateway.engine_name(),
        "capabilities": (caps.to_dict() if (caps := gateway.capabilities()) else None),
        "workers": {
            "total": len(workers),
            "by_state": dict(by_state),
            "slots_total": sum(w["slots"] for w in workers),
            "slots_busy": sum(w["slots_busy"] for w in workers),
        },
        "queue_length": len(scheduler.queue),
        "max_queue_size": scheduler.max_queue_size,
        "running_tasks": [suspension(gateway, shown(task)) for task in scheduler.running()],
        # Sessions whose client dropped, held for a resume (docs/resume.md).
        "suspended_sessions": gateway.sessions.suspended(),
        "uptime_s": round(time.time() - gateway.started_at, 1),
    }
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get("/workers")
async def workers(request: Request) -> dict[str, Any]:
    """Every worker: the reference's fields (``host``, ``port``, ``gpu_id``,
    ISO times) and ours (``url``, ``health``, slots, restarts, ...)."""
    gateway = gateway_of(request)
    restarts = gateway.supervisor.restarts if gateway.supervisor else {}
    listed = []
    for worker_id, link in gateway.links.items():
        worker = link.describe()
        address = urlsplit(worker["url"])
        listed.append(
            {
                **worker,
                "host": address.hostname,
                "port": address.port,
                "last_heartbeat": iso_or_none(worker["last_heartbeat"]),
                "task_started_at": iso_or_none(worker["task_started_at"]),
                "current_request_type": worker["current_request_type"]
                and reference_name(worker["current_request_type"]),
                "restarts": restarts.get(worker_id, 0),
            }
        )
    return {"total": len(listed), "workers": listed}

"""The queue and its wait estimates."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from omnilive.clock import iso
from omnilive.config import reference_name
from omnilive.gateway.http_body import json_body
from omnilive.gateway.http_errors import error_body
from omnilive.gateway.state import Gateway, gateway_of

router = APIRouter()


def _baseline(name: str) -> Any:
    """A baseline field, also accepted under the reference's ``eta_`` name."""
    return Field(None, gt=0, validation_alias=AliasChoices(name, f"eta_{name}"))


class EtaUpdate(BaseModel):
    """``PUT /api/config/eta``: only the fields present are changed. Keys it
    does not know are ignored and named in the answer's ``warnings`` (the
    reference ignores them too, and its clients send some)."""

    model_config = ConfigDict(extra="allow")
    chat_s: float | None = _baseline("chat_s")
    half_duplex_s: float | None = _baseline("half_duplex_s")
    audio_duplex_s: float | None = _baseline("audio_duplex_s")
    omni_duplex_s: float | None = _baseline("omni_duplex_s")
    ema_alpha: float | None = Field(None, gt=0, le=1)
    ema_min_samples: int | None = Field(None, ge=1)
    overrun_floor_s: float | None = Field(None, ge=0)


def shown(item: dict[str, Any]) -> dict[str, Any]:
    """A queue or running-task entry as the API shows it: the reference's
    request-type names and ISO 8601 times (the scheduler keeps epoch seconds)."""
    shown = {**item, "request_type": reference_name(item["request_type"])}
    for key in ("enqueued_at", "started_at"):
        if isinstance(item.get(key), float | int):
            shown[key] = iso(item[key])
    return shown


def suspension(gateway: Gateway, task: dict[str, Any]) -> dict[str, Any]:
    """A running task with ``suspended``: its client dropped, it waits for a resume."""
    session = gateway.sessions.get(str(task.get("session_id")))
    return {**task, "suspended": session is not None and session.suspended}


@router.get("/api/queue")
async def queue(request: Request) -> dict[str, Any]:
    gateway = gateway_of(request)
    scheduler = gateway.pool.scheduler
    return {
        "queue_length": len(scheduler.queue),
        "max_queue_size": scheduler.max_queue_size,
        "items": [shown(item) for item in scheduler.snapshot()],
        "running_tasks": [suspension(gateway, shown(t)) for t in scheduler.running()],
    }


@router.get("/api/queue/{ticket_id}", response_model=None)
async def queue_item(ticket_id: str, request: Request) -> dict[str, Any] | JSONResponse:
    """The waiting ticket (``{found: true, ticket}``, its fields also at the top)."""
    for item in gateway_of(request).pool.scheduler.snapshot():
        if item["ticket_id"] == ticket_id:
            ticket = shown(item)
            return {**ticket, "found": True, "ticket": ticket}
    message = f"no queued ticket {ticket_id} (it may have been assigned or cancelled)"
    return JSONResponse({**error_body(message, "not_found"), "found": False}, status_code=404)


@router.delete("/api/queue/{ticket_id}", response_model=None)
async def cancel_queue_item(ticket_id: str, request: Request) -> dict[str, Any] | JSONResponse:
    if not gateway_of(request).pool.cancel_by_id(ticket_id):
        message = f"no queued ticket {ticket_id}"
        return JSONResponse({**error_body(message, "not_found"), "success": False}, 404)
    return {"success": True, "cancelled": ticket_id}


@router.get("/api/config/eta")
async def get_eta(request: Request) -> dict[str, Any]:
    return gateway_of(request).pool.scheduler.eta.to_dict()


@router.put("/api/config/eta")
async def put_eta(
    request: Request, update: Annotated[EtaUpdate, json_body(EtaUpdate)]
) -> dict[str, Any]:
    unknown = sorted(update.model_extra or {})
    changes = update.model_dump(exclude_unset=True, exclude=set(unknown))
    eta = gateway_of(request).pool.scheduler.eta
    eta.update({k: v for k, v in changes.items() if v is not None})
    warnings = [f"unknown field {name!r} ignored" for name in unknown]
    return {**eta.to_dict(), "warnings": warnings}

"""The queue and its wait estimates."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from omnilive.gateway.state import gateway_of

router = APIRouter()


class EtaUpdate(BaseModel):
    """``PUT /api/config/eta``: only the fields present are changed."""

    model_config = ConfigDict(extra="forbid")
    chat_s: float | None = Field(None, gt=0)
    half_duplex_s: float | None = Field(None, gt=0)
    audio_duplex_s: float | None = Field(None, gt=0)
    omni_duplex_s: float | None = Field(None, gt=0)
    ema_alpha: float | None = Field(None, gt=0, le=1)
    ema_min_samples: int | None = Field(None, ge=1)
    overrun_floor_s: float | None = Field(None, ge=0)


@router.get("/api/queue")
async def queue(request: Request) -> dict[str, Any]:
    scheduler = gateway_of(request).pool.scheduler
    return {
        "queue_length": len(scheduler.queue),
        "max_queue_size": scheduler.max_queue_size,
        "items": scheduler.snapshot(),
        "running_tasks": scheduler.running(),
    }


@router.get("/api/queue/{ticket_id}")
async def queue_item(ticket_id: str, request: Request) -> dict[str, Any]:
    for item in gateway_of(request).pool.scheduler.snapshot():
        if item["ticket_id"] == ticket_id:
            return item
    raise HTTPException(404, f"no queued ticket {ticket_id}")


@router.delete("/api/queue/{ticket_id}")
async def cancel_queue_item(ticket_id: str, request: Request) -> dict[str, Any]:
    if not gateway_of(request).pool.cancel_by_id(ticket_id):
        raise HTTPException(404, f"no queued ticket {ticket_id}")
    return {"cancelled": ticket_id}


@router.get("/api/config/eta")
async def get_eta(request: Request) -> dict[str, Any]:
    return gateway_of(request).pool.scheduler.eta.to_dict()


@router.put("/api/config/eta")
async def put_eta(update: dict[str, Any], request: Request) -> dict[str, Any]:
    try:
        changes = EtaUpdate.model_validate(update).model_dump(exclude_unset=True)
    except ValidationError as exc:
        raise HTTPException(422, exc.errors(include_input=False, include_url=False)) from None
    eta = gateway_of(request).pool.scheduler.eta
    eta.update({k: v for k, v in changes.items() if v is not None})
    return eta.to_dict()

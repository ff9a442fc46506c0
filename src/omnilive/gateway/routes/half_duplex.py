"""Half-duplex voice: ``WS /ws/half_duplex/{session_id}`` and its REST stop."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Request, WebSocket
from pydantic import BaseModel

from omnilive.gateway.auth import principal_of
from omnilive.gateway.http_body import json_body
from omnilive.gateway.sessions import serve_session
from omnilive.gateway.state import gateway_of
from omnilive.protocol.common import decode_client_message
from omnilive.protocol.half_duplex import CLIENT_TYPES, client_message

router = APIRouter()


class StopRequest(BaseModel):
    session_id: str


@router.websocket("/ws/half_duplex/{session_id}")
async def half_duplex_ws(ws: WebSocket, session_id: str) -> None:
    gateway = gateway_of(ws)
    max_bytes = gateway.settings.limits.max_message_bytes

    def validate(raw: str | bytes) -> object:
        return decode_client_message(raw, client_message, CLIENT_TYPES, max_bytes)

    await serve_session(gateway, ws, session_id, "half_duplex", validate)


@router.post("/api/half_duplex/stop")
async def half_duplex_stop(
    request: Request, body: Annotated[StopRequest, json_body(StopRequest)]
) -> dict[str, object]:
    """Stop one half-duplex session, mid-turn if need be; other sessions are untouched."""
    session = gateway_of(request).sessions.get(body.session_id)
    caller = principal_of(request)
    # Someone else's session is not found either: ids must not be probed.
    mine = session is not None and (caller.is_admin or session.owner == caller.key_id)
    if session is None or session.kind != "half_duplex" or not mine:
        raise HTTPException(404, f"no active half-duplex session {body.session_id}")
    if not await session.send_control({"type": "stop"}):
        raise HTTPException(409, f"session {body.session_id} is still waiting in the queue")
    return {"success": True, "session_id": body.session_id}

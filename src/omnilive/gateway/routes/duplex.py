"""Full duplex, audio and omni: ``WS /ws/duplex/{session_id}``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, WebSocket

from omnilive.apps import app_of
from omnilive.gateway.app_gate import require_enabled
from omnilive.gateway.client_ws import fail
from omnilive.gateway.registry import ActiveSession
from omnilive.gateway.sessions import serve_session
from omnilive.gateway.state import gateway_of
from omnilive.protocol.common import ErrorCode, decode_client_message
from omnilive.protocol.duplex import CLIENT_TYPES, Prepare, client_message, parse_mode

router = APIRouter()


@router.websocket("/ws/duplex/{session_id}")
async def duplex_ws(ws: WebSocket, session_id: str, mode: str | None = None) -> None:
    """The task type comes from ``?mode=``, else from ``prepare.mode``, else
    from the old ``adx_`` session-id prefix (audio); omni by default."""
    gateway = gateway_of(ws)
    kind = parse_mode(mode)
    if mode is not None and kind is None:
        await ws.accept()
        await fail(ws, "mode must be audio_duplex or omni_duplex", ErrorCode.INVALID_REQUEST)
        return
    if kind is None:
        kind = "audio_duplex" if session_id.startswith("adx_") else "omni_duplex"
    max_bytes = gateway.settings.limits.max_message_bytes

    def validate(raw: str | bytes) -> Any:
        return decode_client_message(raw, client_message, CLIENT_TYPES, max_bytes)

    def learn_mode(session: ActiveSession, message: Any) -> None:
        declared = parse_mode(message.mode) if isinstance(message, Prepare) else None
        if declared is not None and declared != session.kind:
            require_enabled(ws, app_of(declared))  # raises AppDisabled: the session ends
            session.kind = declared
            gateway.pool.retype(session.ticket, session.lease, declared)

    await serve_session(gateway, ws, session_id, kind, validate, on_message=learn_mode)

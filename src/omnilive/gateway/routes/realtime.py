"""The Realtime API's endpoint: ``WS /v1/realtime?mode=video|audio|chat``.

The sessions live in ``gateway/realtime_session.py`` (video and audio, both
dialects) and ``gateway/realtime_chat.py`` (``mode=chat``, the newer dialect);
the rules in their machines.
"""

from __future__ import annotations

from fastapi import APIRouter, WebSocket

from omnilive.gateway.app_gate import CLOSE_POLICY_VIOLATION, AppDisabled, require_enabled
from omnilive.gateway.client_ws import close_quietly, send_json
from omnilive.gateway.realtime_chat import RealtimeChatConnection
from omnilive.gateway.realtime_session import RealtimeConnection
from omnilive.gateway.state import gateway_of
from omnilive.protocol.realtime import RealtimeErrorCode, error_event

router = APIRouter()


@router.websocket("/v1/realtime")
async def realtime_ws(ws: WebSocket, mode: str = "video") -> None:
    """``model=`` (which the SDK sends) is accepted and ignored: one model serves."""
    gateway = gateway_of(ws)
    await ws.accept()
    if mode not in ("video", "audio", "chat"):
        message = "mode must be video, audio or chat"
        await send_json(ws, error_event(RealtimeErrorCode.INVALID_PAYLOAD, message))
        await close_quietly(ws, 1008)
        return
    try:
        require_enabled(ws, "realtime")
    except AppDisabled as exc:
        await send_json(ws, error_event(RealtimeErrorCode.APP_DISABLED, exc.message))
        await close_quietly(ws, CLOSE_POLICY_VIOLATION)
        return
    if mode == "chat":
        await RealtimeChatConnection(gateway, ws).run()
    else:
        await RealtimeConnection(gateway, ws, mode).run()  # type: ignore[arg-type]

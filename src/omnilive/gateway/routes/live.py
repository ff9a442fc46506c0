"""OpenAI's Live API: ``WS /v1/live/sessions`` (the SDK's ``client.live.connect()``
appends ``/live/sessions`` to its ``…/v1`` base URL). The model is named in
``session.start``, never in the URL; see ``gateway/live_session.py``.

``POST /v1/live/sessions`` (the SDK's WebRTC ``client.live.create``) is not
served: the WebRTC transport carries the GA dialect only (docs/modes/live.md).
"""

from __future__ import annotations

from fastapi import APIRouter, WebSocket

from omnilive.gateway.app_gate import CLOSE_POLICY_VIOLATION, AppDisabled, require_enabled
from omnilive.gateway.client_ws import close_quietly, send_json
from omnilive.gateway.live_session import LiveConnection
from omnilive.gateway.state import gateway_of
from omnilive.protocol.openai_live_events import error_event

router = APIRouter()


@router.websocket("/v1/live/sessions")
async def live_ws(ws: WebSocket) -> None:
    await ws.accept()
    try:
        require_enabled(ws, "realtime")  # Live is part of the Realtime app
    except AppDisabled as exc:
        await send_json(ws, error_event("app_disabled", exc.message))
        await close_quietly(ws, CLOSE_POLICY_VIOLATION)
        return
    await LiveConnection(gateway_of(ws), ws).run()

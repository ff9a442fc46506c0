"""OpenAI's Live API: ``WS /v1/live/sessions`` (the SDK's ``client.live.connect()``
appends ``/live/sessions`` to its ``…/v1`` base URL). The model is named in
``session.start``, never in the URL; see ``gateway/live/session.py``.

Over WebRTC (``docs/webrtc.md``), ``POST /v1/live/sessions`` (the SDK's
``client.live.create``): the JSON body's ``session`` becomes the call's first
event, a ``session.start`` on the same WebSocket route, so the queue, the
key's limits, auth and the app switch are the WebSocket's; the answer is
``{"session": {"id"}, "transport": {"type": "webrtc", "sdp"}}``. The audio
is the tracks' (Opus): the session's format is PCM at 24 kHz between the
transport and the session whatever the body asked, and its output audio
deltas leave the data channel for the answer track, as OpenAI's WebRTC has
it. ``POST /v1/live/sessions/{id}/hangup`` ends the call. No Live client
knows a resume token, so a lost call ends its session, as a lost socket does.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request, Response, WebSocket
from fastapi.responses import JSONResponse

from omnilive.gateway.app_gate import CLOSE_POLICY_VIOLATION, AppDisabled, require_enabled
from omnilive.gateway.client_ws import close_quietly, send_json
from omnilive.gateway.live.session import LiveConnection
from omnilive.gateway.routes.webrtc import (
    hang_up_call,
    offer_of,
    open_call,
    openai_refusal,
)
from omnilive.gateway.state import gateway_of
from omnilive.gateway.webrtc.dialects import Dialect, MediaDialect
from omnilive.gateway.webrtc.offer import CallRefused, parse_live_offer
from omnilive.protocol.openai_live_events import error_event

router = APIRouter()
LIVE_PATH = "/v1/live/sessions"
# What the call's session reads and writes: the tracks' audio, resampled.
TRANSPORT_FORMAT = {"type": "audio/pcm", "rate": 24_000}


@router.websocket(LIVE_PATH)
async def live_ws(ws: WebSocket) -> None:
    await ws.accept()
    try:
        require_enabled(ws, "realtime")  # Live is part of the Realtime app
    except AppDisabled as exc:
        await send_json(ws, error_event("app_disabled", exc.message))
        await close_quietly(ws, CLOSE_POLICY_VIOLATION)
        return
    await LiveConnection(gateway_of(ws), ws).run()


@router.post(LIVE_PATH)
async def live_call(request: Request) -> Response:
    try:
        offer = await offer_of(request, "live", parse=parse_live_offer)
        start = {"type": "session.start", "session": over_webrtc(offer.session or {})}
        dialect = MediaDialect(Dialect.LIVE)
        call_id, answer = await open_call(
            request, offer, dialect, LIVE_PATH, "", [json.dumps(start)]
        )
    except CallRefused as refused:
        return openai_refusal(refused)
    body = {"session": {"id": call_id}, "transport": {"type": "webrtc", "sdp": answer}}
    return JSONResponse(body, status_code=201, headers={"X-Call-Id": call_id})


@router.post(LIVE_PATH + "/{session_id}/hangup")
async def live_hang_up(request: Request, session_id: str) -> Response:
    return hang_up_call(request, session_id)


def over_webrtc(session: dict[str, Any]) -> dict[str, Any]:
    """``session`` with the transport's audio format (module docstring); a
    malformed ``audio`` is left for ``session.start`` to refuse."""
    audio = session.get("audio", {})
    if not isinstance(audio, dict):
        return session
    return {**session, "audio": {**audio, "format": TRANSPORT_FORMAT}}

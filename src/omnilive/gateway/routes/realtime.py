"""The Realtime API's endpoint: ``WS /v1/realtime?mode=video|audio|chat``,
and OpenAI's Realtime API (GA) on the same path.

The dialect is chosen at the upgrade, before any event: a connection that
names no ``mode`` and either names a ``model`` (as OpenAI's SDKs do) or
offers the subprotocol ``realtime`` (OpenAI's browser clients) speaks the
GA dialect (``gateway/openai/session.py``). Every other connection is a
MiniCPM-o one, as before: ``gateway/realtime/session.py`` (video and audio,
both MiniCPM-o dialects, told apart by their first event) and
``gateway/realtime/chat.py`` (``mode=chat``).
"""

from __future__ import annotations

from fastapi import APIRouter, WebSocket

from omnilive.gateway.app_gate import CLOSE_POLICY_VIOLATION, AppDisabled, require_enabled
from omnilive.gateway.auth import OPENAI_SUBPROTOCOL
from omnilive.gateway.client_ws import close_quietly, send_json
from omnilive.gateway.openai.session import OpenAIRealtimeConnection
from omnilive.gateway.realtime.chat import RealtimeChatConnection
from omnilive.gateway.realtime.session import RealtimeConnection
from omnilive.gateway.resume_link import serve_resume
from omnilive.gateway.state import gateway_of
from omnilive.protocol.common import ProtocolError
from omnilive.protocol.openai_realtime import DEFAULT_MODEL
from omnilive.protocol.openai_realtime import error_event as openai_error_event
from omnilive.protocol.realtime import RealtimeErrorCode, error_event

router = APIRouter()


@router.websocket("/v1/realtime")
async def realtime_ws(ws: WebSocket, mode: str | None = None, model: str | None = None) -> None:
    """For the MiniCPM-o dialects ``model=`` (which openbmb-realtime sends
    beside ``mode``) is ignored: one model serves."""
    gateway = gateway_of(ws)
    await ws.accept()
    openai = speaks_openai(ws, mode, model)

    async def refuse(exc: ProtocolError) -> None:
        if openai:
            await send_json(ws, openai_error_event(str(exc.code), exc.message))
        else:
            await send_json(ws, error_event(RealtimeErrorCode.RESUME_REFUSED, exc.message))
        await close_quietly(ws, CLOSE_POLICY_VIOLATION)

    if await serve_resume(gateway, ws, "realtime", refuse):
        return
    if openai:
        await _open_openai(ws, model or DEFAULT_MODEL)
        return
    mode = mode or "video"
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
        await RealtimeConnection(gateway, ws, mode).run()  # type: ignore[arg-type]  # not chat: video or audio


def speaks_openai(ws: WebSocket, mode: str | None, model: str | None) -> bool:
    """The dialect rule (docs/reference/openai-realtime.md): no ``mode``, and a ``model``
    or OpenAI's browser subprotocol."""
    offered = ws.scope.get("subprotocols") or []
    return mode is None and (model is not None or OPENAI_SUBPROTOCOL in offered)


async def _open_openai(ws: WebSocket, model: str) -> None:
    try:
        require_enabled(ws, "realtime")
    except AppDisabled as exc:
        await send_json(ws, openai_error_event("app_disabled", exc.message))
        await close_quietly(ws, CLOSE_POLICY_VIOLATION)
        return
    await OpenAIRealtimeConnection(gateway_of(ws), ws, model[:128]).run()

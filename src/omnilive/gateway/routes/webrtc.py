"""WebRTC signalling (``docs/webrtc.md``): one HTTP offer/answer per call.

- ``POST /v1/realtime/calls[?model=]``: OpenAI's Realtime API (GA) over
  WebRTC, in OpenAI's shape: the body is the SDP offer (``application/sdp``)
  or a form with ``sdp`` and ``session``; the answer is ``201`` with the SDP
  and ``Location: /v1/realtime/calls/{call_id}``; events on the data channel
  (OpenAI names it ``oai-events``). ``POST .../{call_id}/hangup`` ends it.
- ``POST /api/webrtc/half_duplex/{session_id}`` and
  ``POST /api/webrtc/duplex/{session_id}[?mode=]``: omnilive's own modes,
  the same way, with the protocol's JSON messages on the data channel.
- ``GET /api/webrtc/config``: the ICE servers the pages should use.

Refusals are JSON with a documented code: 400 ``invalid_sdp``,
``offer_without_audio``, ``offer_without_data_channel``; 415
``unsupported_media_type``; 503 ``too_many_peer_connections``,
``webrtc_disabled`` or ``webrtc_unavailable`` (aiortc or PyAV not installed);
the session's own refusals (401, 403, 429, 503) as the WebSocket path would
make them.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse

from omnilive.gateway.auth import principal_of
from omnilive.gateway.http_errors import error_body
from omnilive.gateway.resume import LAST_SEQ_PARAM, SEQ_PARAM, TOKEN_PARAM
from omnilive.gateway.webrtc.dialects import Dialect, MediaDialect
from omnilive.gateway.webrtc.offer import MAX_OFFER_BYTES, Offer, OfferError, parse_offer
from omnilive.ids import mint
from omnilive.protocol.openai_realtime import DEFAULT_MODEL

if TYPE_CHECKING:
    from omnilive.gateway.webrtc.calls import Calls

router = APIRouter()
RESUME_PARAMS = (TOKEN_PARAM, LAST_SEQ_PARAM, SEQ_PARAM)
# The headers a session's scope keeps from its signalling request: what the
# WebSocket path's auth and origin checks read.
_KEPT_HEADERS = frozenset({b"authorization", b"origin", b"host", b"user-agent", b"cookie"})
_REFUSAL_STATUS = {"unauthorized": 401, "forbidden": 403, "origin_not_allowed": 403,
                   "not_found": 404, "rate_limited": 429, "too_many_sessions": 429}  # fmt: skip


class CallRefused(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def calls_of(request: Request) -> Calls:
    calls = request.app.state.webrtc
    if calls is None:  # aiortc or PyAV cannot be imported here (the log said so)
        raise CallRefused(
            503, "webrtc_unavailable", "WebRTC is not installed on this server; use the WebSocket"
        )
    return calls


@router.get("/api/webrtc/config")
async def webrtc_config(request: Request) -> dict[str, Any]:
    """What a page needs to open a call: whether WebRTC is on, and the ICE servers."""
    settings = request.app.state.gateway.settings.webrtc
    servers = [s.model_dump(exclude_none=True) for s in settings.ice_servers]
    calls = request.app.state.webrtc
    if calls is None:  # not installed: the pages use the WebSocket
        return {"enabled": False, "ice_servers": servers, "unavailable": True}
    return {"enabled": settings.enabled, "ice_servers": servers, **calls.stats()}


@router.post("/v1/realtime/calls")
async def realtime_call(request: Request, model: str | None = None) -> Response:
    try:
        offer = await _offer(request)
        model = (model or (offer.session or {}).get("model") or DEFAULT_MODEL)[:128]
        first = []
        if offer.session:
            session = {k: v for k, v in offer.session.items() if k != "model"}
            first.append(json.dumps({"type": "session.update", "session": session}))
        # Escaped: a model name cannot add a mode=.
        query = urlencode({"model": model, **_resuming(request)})
        return await _open(
            request, offer, MediaDialect(Dialect.OPENAI), "/v1/realtime", query, first
        )
    except CallRefused as refused:
        body = {"error": {"type": "invalid_request_error", "code": refused.code,
                          "message": refused.message, "param": None}}  # fmt: skip
        return JSONResponse(body, status_code=refused.status)


@router.post("/v1/realtime/calls/{call_id}/hangup")
async def hang_up(request: Request, call_id: str) -> Response:
    caller = principal_of(request)
    calls = request.app.state.webrtc
    call = calls.get(call_id, caller.key_id, caller.is_admin) if calls is not None else None
    if call is None:
        body = {"error": {"type": "invalid_request_error", "code": "call_not_found",
                          "message": f"no open call {call_id}", "param": None}}  # fmt: skip
        return JSONResponse(body, status_code=404)
    call.close()
    return Response(status_code=200)


@router.post("/api/webrtc/half_duplex/{session_id}")
async def half_duplex_call(request: Request, session_id: str) -> Response:
    query = urlencode(_resuming(request))
    half_duplex = MediaDialect(Dialect.HALF_DUPLEX)
    return await _own_mode(request, half_duplex, f"/ws/half_duplex/{session_id}", query)


@router.post("/api/webrtc/duplex/{session_id}")
async def duplex_call(
    request: Request,
    session_id: str,
    mode: str | None = None,
    max_slice_nums: Annotated[int | None, Query(ge=1, le=9)] = None,
) -> Response:
    """``max_slice_nums``: the frame size the call sends before (or, resuming,
    without) the session's ``prepare``, which decides it otherwise."""
    query = urlencode({**({"mode": mode} if mode else {}), **_resuming(request)})
    dialect = MediaDialect(Dialect.DUPLEX)
    dialect.take_slices(max_slice_nums)
    return await _own_mode(request, dialect, f"/ws/duplex/{session_id}", query)


def _resuming(request: Request) -> dict[str, str]:
    """The resume parameters of a call's offer (docs/resume.md), passed on to
    its session's route: a call whose connection was lost continues its
    session from a new offer, as a dropped WebSocket does from a new socket."""
    return {k: v[:256] for k, v in request.query_params.items() if k in RESUME_PARAMS}


async def _own_mode(request: Request, dialect: MediaDialect, path: str, query: str) -> Response:
    try:
        offer = await _offer(request)
        return await _open(request, offer, dialect, path, query)
    except CallRefused as refused:
        return JSONResponse(error_body(refused.message, refused.code), status_code=refused.status)


async def _offer(request: Request) -> Offer:
    if not request.app.state.gateway.settings.webrtc.enabled:
        raise CallRefused(503, "webrtc_disabled", "WebRTC is switched off; use the WebSocket")
    calls_of(request)  # installed, or refused before the offer is read
    content_type = request.headers.get("content-type", "")
    form: dict[str, str] | None = None
    try:
        if content_type.startswith("multipart/form-data"):
            async with request.form(max_files=0, max_fields=4, max_part_size=MAX_OFFER_BYTES) as f:
                form = {k: v for k, v in f.items() if isinstance(v, str)}
            return parse_offer(b"", content_type, form)
        body = b""
        async for part in request.stream():
            body += part
            if len(body) > MAX_OFFER_BYTES:
                break
        return parse_offer(body, content_type)
    except OfferError as exc:
        raise CallRefused(exc.status, exc.code, exc.message) from None


async def _open(
    request: Request,
    offer: Offer,
    dialect: MediaDialect,
    path: str,
    query: str,
    first_events: list[str] | None = None,
) -> Response:
    from omnilive.gateway.webrtc.call import Call, Refused  # imports aiortc
    from omnilive.gateway.webrtc.calls import TooManyCalls

    calls = calls_of(request)
    call_id = mint("rtc", 12)
    caller = principal_of(request)
    settings = request.app.state.gateway.settings
    scope = _session_scope(request, path, query, call_id)
    call = Call(call_id, dialect, settings.webrtc, scope, first_events,
                settings.limits.max_message_bytes)  # fmt: skip
    try:
        calls.add(call, caller.key_id)
    except TooManyCalls as exc:
        await call.pc.close()
        raise CallRefused(503, "too_many_peer_connections", str(exc)) from None
    try:
        answer = await call.answer(offer)
    except OfferError as exc:
        calls.discard(call_id)
        await call.pc.close()
        raise CallRefused(exc.status, exc.code, exc.message) from None
    refused = await calls.start(call, request.app)
    if isinstance(refused, Refused):
        raise CallRefused(_REFUSAL_STATUS.get(refused.reason, 503), refused.reason or "refused",
                          f"the session was refused: {refused.reason or refused.code}")  # fmt: skip
    location = f"/v1/realtime/calls/{call_id}"
    headers = {"Location": location, "X-Call-Id": call_id}
    return Response(answer, status_code=201, media_type="application/sdp", headers=headers)


def _session_scope(request: Request, path: str, query: str, call_id: str) -> dict[str, Any]:
    """The WebSocket scope the call's session runs under: the signalling
    request's client, credentials and origin, the route's path."""
    scope = request.scope
    return {
        "type": "websocket",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "scheme": "wss" if scope.get("scheme") == "https" else "ws",
        "path": path,
        "raw_path": path.encode(),
        "root_path": scope.get("root_path", ""),
        "query_string": query.encode(),
        "headers": [(k, v) for k, v in scope["headers"] if k in _KEPT_HEADERS],
        "client": scope.get("client"),
        "server": scope.get("server"),
        "subprotocols": [],
        "extensions": {},
        "state": dict(scope.get("state") or {}),
        "omnilive.webrtc_call": call_id,
    }

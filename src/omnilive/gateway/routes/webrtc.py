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
- ``POST /v1/live/sessions``: OpenAI's Live API over WebRTC, in
  ``routes/live.py`` with these helpers.

Refusals are JSON with a documented code: 400 ``invalid_sdp``,
``offer_without_audio``, ``offer_without_data_channel``; 415
``unsupported_media_type``; 503 ``too_many_peer_connections``,
``webrtc_disabled`` or ``webrtc_unavailable`` (aiortc or PyAV not installed);
the session's own refusals (401, 403, 429, 503) as the WebSocket path would
make them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse

from omnilive.gateway.auth import Gatekeeper, principal_of
from omnilive.gateway.http_body import read_capped, with_body
from omnilive.gateway.http_errors import HttpRefusal, error_body
from omnilive.gateway.resume import LAST_SEQ_PARAM, SEQ_PARAM, TOKEN_PARAM, kept_token
from omnilive.gateway.resume_link import asks_claimable_resume
from omnilive.gateway.webrtc.dialects import Dialect, MediaDialect
from omnilive.gateway.webrtc.offer import (
    MAX_OFFER_BYTES,
    CallRefused,
    Offer,
    OfferError,
    parse_offer,
)
from omnilive.ids import is_safe_id, mint
from omnilive.protocol.common import ErrorCode, ProtocolError
from omnilive.protocol.openai_realtime import DEFAULT_MODEL, EXTENSIONS_PARAM

if TYPE_CHECKING:
    from omnilive.gateway.webrtc.calls import Calls

router = APIRouter()
RESUME_PARAMS = (TOKEN_PARAM, LAST_SEQ_PARAM, SEQ_PARAM)
# The headers a session's scope keeps from its signalling request: what the
# WebSocket path's auth and origin checks read.
_KEPT_HEADERS = frozenset({b"authorization", b"origin", b"host", b"user-agent", b"cookie"})


def calls_of(request: Request) -> Calls:
    calls: Calls | None = request.app.state.webrtc
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
        offer = await offer_of(request, "realtime")
        model = (model or (offer.session or {}).get("model") or DEFAULT_MODEL)[:128]
        first = []
        if offer.session:
            session = {k: v for k, v in offer.session.items() if k != "model"}
            first.append(json.dumps({"type": "session.update", "session": session}))
        # Escaped: a model name cannot add a mode=.
        query = urlencode({"model": model, **_resuming(request), **_extensions(request)})
        dialect = MediaDialect(Dialect.OPENAI)
        return _sdp_answer(*await open_call(request, offer, dialect, "/v1/realtime", query, first))
    except CallRefused as refused:
        return openai_refusal(refused)


@router.post("/v1/realtime/calls/{call_id}/hangup")
async def hang_up(request: Request, call_id: str) -> Response:
    return hang_up_call(request, call_id)


def hang_up_call(request: Request, call_id: str) -> Response:
    """End the caller's open call ``call_id`` (an admin's: anyone's), or 404."""
    caller = principal_of(request)
    calls = request.app.state.webrtc
    call = calls.get(call_id, caller.key_id, caller.is_admin) if calls is not None else None
    if call is None:
        return openai_refusal(CallRefused(404, "call_not_found", f"no open call {call_id}"))
    call.close()
    return Response(status_code=200)


def openai_refusal(refused: CallRefused) -> JSONResponse:
    """A signalling refusal in OpenAI's shape."""
    body = {"error": {"type": "invalid_request_error", "code": refused.code,
                      "message": refused.message, "param": None}}  # fmt: skip
    return JSONResponse(body, status_code=refused.status)


@router.post("/api/webrtc/half_duplex/{session_id}")
async def half_duplex_call(request: Request, session_id: str) -> Response:
    query = urlencode(_resuming(request))
    half_duplex = MediaDialect(Dialect.HALF_DUPLEX)
    return await _own_mode(request, half_duplex, "half_duplex", session_id, query)


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
    return await _own_mode(request, dialect, "duplex", session_id, query)


def _extensions(request: Request) -> dict[str, str]:
    """omnilive's own events for a GA call that asks for them, as on the WebSocket."""
    wanted = request.query_params.get(EXTENSIONS_PARAM)
    return {EXTENSIONS_PARAM: wanted[:8]} if wanted is not None else {}


def _resuming(request: Request) -> dict[str, str]:
    """The resume parameters of a call's offer (docs/resume.md), passed on to
    its session's route: a call whose connection was lost continues its
    session from a new offer, as a dropped WebSocket does from a new socket.
    The token is put back where the auth middleware took it from: the
    session's scope then asks to resume as a WebSocket's does, and is not
    counted as a new session of its key."""
    asked = {**request.query_params, **kept_token(request.scope)}
    return {k: v[:256] for k, v in asked.items() if k in RESUME_PARAMS}


async def _own_mode(
    request: Request, dialect: MediaDialect, route: str, session_id: str, query: str
) -> Response:
    try:
        offer = await offer_of(request, route, session_id)
        path = f"/ws/{route}/{session_id}"
        return _sdp_answer(*await open_call(request, offer, dialect, path, query))
    except CallRefused as refused:
        return JSONResponse(error_body(refused.message, refused.code), status_code=refused.status)


async def offer_of(
    request: Request,
    route: str,
    session_id: str | None = None,
    parse: Callable[[bytes, str], Offer] | None = None,
) -> Offer:
    """The call's offer, once the session it asks for could begin: what its
    route would refuse at once is refused here, before any answer (a session
    refused after the answer had no open channel to say why on). ``parse``
    reads a body of the route's own shape (its bytes and content type)."""
    if not request.app.state.gateway.settings.webrtc.enabled:
        raise CallRefused(503, "webrtc_disabled", "WebRTC is switched off; use the WebSocket")
    calls_of(request)  # installed, or refused before the offer is read
    _check_session(request, route, session_id)
    content_type = request.headers.get("content-type", "")
    try:
        body = await read_capped(request, MAX_OFFER_BYTES)
        if parse is not None:
            return parse(body, content_type)
        if content_type.startswith("multipart/form-data"):
            async with with_body(request, body).form(max_files=0, max_fields=4) as fields:
                form = {k: v for k, v in fields.items() if isinstance(v, str)}
            return parse_offer(b"", content_type, form)
        return parse_offer(body, content_type)
    except HttpRefusal as refusal:  # over the cap, declared or sent
        raise CallRefused(refusal.status, refusal.code, refusal.message) from None
    except OfferError as exc:
        raise CallRefused(exc.status, exc.code, exc.message) from None


def _check_session(request: Request, route: str, session_id: str | None) -> None:
    """A resume that would be refused, or a session id the route refuses."""
    gateway = request.app.state.gateway
    asked = {**request.query_params, **kept_token(request.scope)}
    try:
        resuming = asks_claimable_resume(gateway, asked, principal_of(request).key_id, route)
    except ProtocolError as exc:
        raise CallRefused(409, exc.code, exc.message) from None
    if not resuming and session_id is not None and not is_safe_id(session_id):
        message = "session id must be 1-128 of A-Z a-z 0-9 _ -"
        raise CallRefused(400, ErrorCode.INVALID_REQUEST, message)


def _sdp_answer(call_id: str, answer: str) -> Response:
    """An opened call's answer in OpenAI's Realtime shape: 201, the SDP, its Location."""
    headers = {"Location": f"/v1/realtime/calls/{call_id}", "X-Call-Id": call_id}
    return Response(answer, status_code=201, media_type="application/sdp", headers=headers)


async def open_call(
    request: Request,
    offer: Offer,
    dialect: MediaDialect,
    path: str,
    query: str,
    first_events: list[str] | None = None,
) -> tuple[str, str]:
    """Answer ``offer`` with a call whose session runs on the WebSocket route
    ``path``: the call's id and the SDP answer, once the session began. The
    call runs here, or in a media process (``webrtc.media_processes``)."""
    calls = calls_of(request)
    call_id = mint("rtc", 12)
    caller = principal_of(request)
    settings = request.app.state.gateway.settings
    if calls.media is not None:
        from omnilive.gateway.webrtc.media_wire import OpenCall

        gatekeeper: Gatekeeper = request.app.state.auth
        opening = OpenCall(
            call_id, dialect.dialect.value, offer.sdp, path, query,
            credential=gatekeeper.passes.mint(caller, path),
            frame_max_side=dialect.frame_max_side, media=offer.media,
            first_events=tuple(first_events or ()),
            user_agent=request.headers.get("user-agent"),
        )  # fmt: skip
        return call_id, await calls.media.open(opening, caller.key_id)
    from omnilive.gateway.webrtc.call import Call  # imports aiortc
    from omnilive.gateway.webrtc.calls import open_here

    scope = _session_scope(request, path, query, call_id)
    call = Call(call_id, dialect, settings.webrtc, scope, first_events,
                settings.limits.max_message_bytes)  # fmt: skip
    return call_id, await open_here(calls, call, caller.key_id, offer, request.app)


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

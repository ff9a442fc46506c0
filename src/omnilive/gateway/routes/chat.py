"""Turn-based chat: ``WS /ws/chat`` and ``POST /api/chat`` (spec/chat.md)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.websockets import WebSocketDisconnect

from omnilive.audio import OUTPUT_RATE
from omnilive.gateway.app_gate import AppDisabled, refuse, require_enabled
from omnilive.gateway.client_ws import (
    close_quietly,
    fail,
    send_json,
    until_disconnect,
)
from omnilive.gateway.http_body import read_json
from omnilive.gateway.http_errors import HttpRefusal, error_body, status_for
from omnilive.gateway.lifecycle import Ending
from omnilive.gateway.registry import ActiveSession
from omnilive.gateway.session_link import SessionLink, gateway_session, until_shutdown
from omnilive.gateway.sessions import tell_plain
from omnilive.gateway.state import Gateway, gateway_of
from omnilive.ids import mint
from omnilive.logs import bind_session
from omnilive.protocol.chat import ChatRequest
from omnilive.protocol.common import (
    ErrorCode,
    ProtocolError,
    describe_validation_error,
    json_object,
    parse_json_object,
)
from omnilive.protocol.internal import Envelope
from omnilive.wsutil import race, receive_frame

router = APIRouter()


def validate_chat(gateway: Gateway, raw: str | bytes) -> ChatRequest:
    """Everything the gateway can check without decoding media."""
    return check_chat(gateway, parse_json_object(raw, gateway.settings.limits.max_message_bytes))


def check_chat(gateway: Gateway, data: dict[str, Any]) -> ChatRequest:
    """A decoded chat request, checked as far as it can be without its media."""
    limits = gateway.settings.limits
    try:
        request = ChatRequest.model_validate(data)
    except ValidationError as exc:
        raise ProtocolError(ErrorCode.INVALID_REQUEST, describe_validation_error(exc)) from None
    if len(request.messages) > limits.max_chat_messages:
        raise ProtocolError(
            ErrorCode.PAYLOAD_TOO_LARGE,
            f"{len(request.messages)} messages exceed the limit of {limits.max_chat_messages}",
        )
    if request.audio_seconds() > limits.max_chat_audio_s:
        raise ProtocolError(
            ErrorCode.PAYLOAD_TOO_LARGE,
            f"{request.audio_seconds():.0f} s of audio exceed the limit of "
            f"{limits.max_chat_audio_s:.0f} s",
        )
    if request.tts.ref_audio_path and not (request.tts.ref_audio_data or request.tts.ref_audio_id):
        raise ProtocolError(
            ErrorCode.INVALID_REQUEST,
            "tts.ref_audio_path is not accepted (clients cannot name server files); "
            "send the voice as tts.ref_audio_data or name a stored one in tts.ref_audio_id",
        )
    capabilities = gateway.capabilities()
    if capabilities is not None:
        missing = sorted(request.modalities() - {m.value for m in capabilities.input_modalities})
        if missing:
            capability = "vision" if missing[0] in ("image", "video") else missing[0]
            raise ProtocolError(
                ErrorCode.UNSUPPORTED,
                f"engine '{gateway.engine_name()}' cannot take {missing[0]} input "
                f"(missing capability: {capability})",
            )
    return request


def _chat_session(connection: Request | WebSocket) -> ActiveSession:
    """A new chat id, as a session: shutdown waits for it, metrics count it.
    It doubles as the recording id (``recording_session_id`` of ``done``)."""
    session_id = mint("chat")
    bind_session(session_id)
    return ActiveSession(session_id, "chat")


@router.websocket("/ws/chat")
async def chat_ws(ws: WebSocket) -> None:
    gateway = gateway_of(ws)
    await ws.accept()
    try:
        require_enabled(ws, "turnbased")
    except AppDisabled as exc:
        await refuse(ws, exc)
        return
    try:
        raw = await asyncio.wait_for(
            receive_frame(ws), gateway.settings.limits.first_message_timeout_s
        )
    except TimeoutError:
        await fail(ws, "no request received", ErrorCode.TIMEOUT)
        return
    except WebSocketDisconnect:
        return
    try:
        request = validate_chat(gateway, raw)
    except ProtocolError as exc:
        await fail(ws, exc.message, exc.code)
        return
    session = _chat_session(ws)
    async with gateway_session(gateway, session, tell_plain(ws), ws) as link:
        link.lifecycle.note_recording(session.session_id)
        if link.submit():
            await race(
                _serve_chat_ws(link, ws, request),
                lambda: until_shutdown(gateway, until_disconnect(ws)),
            )
    await close_quietly(ws)


async def _serve_chat_ws(link: SessionLink, ws: WebSocket, request: ChatRequest) -> None:
    async def to_client(_: Envelope, payload: str) -> None:
        await ws.send_text(payload)

    await link.acquire(lambda m: send_json(ws, m))
    async with link.worker() as worker:
        await worker.send(request.model_dump_json())
        link.end(await worker.relay(to_client))


def _error_response(status: int, message: str, code: ErrorCode | str) -> JSONResponse:
    return JSONResponse({"success": False, **error_body(message, str(code))}, status)


def _answer(done: dict[str, Any], queue_wait_ms: float, estimated_wait_s: float) -> dict[str, Any]:
    """The worker's ``done`` as ``POST /api/chat`` answers it: our fields and
    the reference's (``tokens_generated``, ``token_stats``, ``duration_ms``, ...)."""
    body = {key: value for key, value in done.items() if key != "type"}
    generated, prompt = body.get("generated_tokens", 0), body.get("input_tokens", 0)
    return {
        "success": True,
        "error": None,
        "audio_path": None,
        "audio_sample_rate": OUTPUT_RATE,
        "tokens_generated": generated,
        "duration_ms": body.get("timings", {}).get("total_ms"),
        "token_stats": {
            "cached_tokens": 0,
            "input_tokens": prompt,
            "generated_tokens": generated,
            "total_tokens": prompt + generated,
        },
        **body,
        "queue_wait_ms": round(queue_wait_ms, 1),
        "estimated_queue_wait_s": round(estimated_wait_s, 1),
    }


async def _until_http_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


# How ``POST /api/chat`` answers a request the gateway ended: status, error code.
_HTTP_ENDINGS = {
    Ending.QUEUE_FULL: (503, ErrorCode.QUEUE_FULL),
    Ending.NO_WORKERS: (503, ErrorCode.NO_WORKERS),
    Ending.SHUTDOWN: (503, ErrorCode.SERVER_SHUTDOWN),
    Ending.CANCELLED: (409, ErrorCode.CANCELLED),
    Ending.APP_DISABLED: (403, ErrorCode.APP_DISABLED),
    Ending.WORKER_BUSY: (502, ErrorCode.WORKER_FAILED),
    Ending.WORKER_UNREACHABLE: (502, ErrorCode.WORKER_FAILED),
    Ending.WORKER_LOST: (502, ErrorCode.WORKER_FAILED),
    Ending.INTERNAL_ERROR: (502, ErrorCode.WORKER_FAILED),
}


@router.post("/api/chat")
async def chat_http(request: Request) -> JSONResponse:
    """Non-streaming chat: waits in the queue, answers with the whole result."""
    gateway = gateway_of(request)
    try:
        require_enabled(request, "turnbased")
    except AppDisabled as exc:
        return _error_response(403, exc.message, ErrorCode.APP_DISABLED)
    try:
        data = await read_json(request, gateway.settings.limits.max_message_bytes)
        chat = check_chat(gateway, json_object(data))
    except ProtocolError as exc:
        return _error_response(status_for(exc.code), exc.message, exc.code)
    except HttpRefusal as exc:
        return _error_response(exc.status, exc.message, exc.code)
    answer: list[JSONResponse] = []

    async def tell(ending: Ending, detail: str) -> None:
        status, code = _HTTP_ENDINGS[ending]
        answer.append(_error_response(status, detail, code))

    session = _chat_session(request)
    async with gateway_session(gateway, session, tell) as link:
        link.lifecycle.note_recording(session.session_id)
        if link.submit():
            work = _serve_chat_http(link, chat)
            answer.append(
                await race(work, lambda: until_shutdown(gateway, _until_http_disconnect(request)))
            )
    if link.ending is Ending.CLIENT_LEFT and not answer:
        return _error_response(499, "client disconnected", "client_closed")
    return answer[0]


async def _serve_chat_http(link: SessionLink, chat: ChatRequest) -> JSONResponse:
    queued_at = time.perf_counter()

    async def ignore(_: dict[str, Any]) -> None:
        return None

    assert link.ticket is not None
    estimated_wait_s = link.gateway.pool.scheduler.estimates().get(link.ticket.ticket_id, 0.0)
    await link.acquire(ignore)
    queue_wait_ms = (time.perf_counter() - queued_at) * 1000
    messages: list[dict[str, Any]] = []

    async def collect(_: Envelope, text: str) -> None:
        messages.append(json.loads(text))

    async with link.worker() as worker:
        await worker.send(chat.model_copy(update={"streaming": False}).model_dump_json())
        ending = await worker.relay(collect)
    link.end(ending)
    final = messages[-1] if messages else {}
    if ending is Ending.DONE and final.get("type") == "done":
        return JSONResponse(_answer(final, queue_wait_ms, estimated_wait_s))
    if final.get("type") == "error":
        status = 422 if final.get("code") in ("unsupported_capability", "invalid_request") else 502
        return _error_response(status, final["error"], final.get("code", "inference_error"))
    # Lost: the gateway's answer (its tell) says so; anything else is the worker's failure.
    worker_id = link.lease.worker_id if link.lease is not None else "?"
    return _error_response(502, f"worker {worker_id} failed", ErrorCode.WORKER_FAILED)

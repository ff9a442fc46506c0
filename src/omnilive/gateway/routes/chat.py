"""Turn-based chat: ``WS /ws/chat`` and ``POST /api/chat`` (spec/chat.md)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.background import BackgroundTask
from starlette.websockets import WebSocketDisconnect

from omnilive.audio import OUTPUT_RATE
from omnilive.gateway.app_gate import AppDisabled, refuse, require_enabled
from omnilive.gateway.bridge import (
    SessionEnd,
    WorkerConnectError,
    open_worker_session,
    relay_to_client,
    release_lease,
)
from omnilive.gateway.client_ws import (
    CLOSE_TRY_AGAIN,
    close_quietly,
    fail,
    send_json,
    until_disconnect,
)
from omnilive.gateway.http_errors import error_body
from omnilive.gateway.registry import ActiveSession
from omnilive.gateway.scheduler import NoWorkersError, QueueFullError, Ticket
from omnilive.gateway.sessions import ServerShutdown, tell_shutdown, until_shutdown
from omnilive.gateway.state import Gateway, gateway_of
from omnilive.ids import mint
from omnilive.logs import bind_session
from omnilive.protocol.chat import ChatRequest
from omnilive.protocol.common import (
    ErrorCode,
    ProtocolError,
    describe_validation_error,
    parse_json_object,
)
from omnilive.recording.recovery import recover_abandoned
from omnilive.wsutil import PeerGone, race, receive_frame

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


def submit(gateway: Gateway, session_id: str) -> Ticket:
    """Queue a chat request; raises ProtocolError when it cannot even wait."""
    try:
        return gateway.pool.submit("chat", session_id)
    except QueueFullError as exc:
        raise ProtocolError(ErrorCode.QUEUE_FULL, str(exc)) from None
    except NoWorkersError as exc:
        raise ProtocolError(ErrorCode.NO_WORKERS, str(exc)) from None


@contextlib.contextmanager
def _registered_chat(gateway: Gateway) -> Iterator[str]:
    """A new chat id, registered like every session while the request lasts:
    shutdown waits for it, metrics count it."""
    session_id = mint("chat")
    bind_session(session_id)
    gateway.sessions.add(ActiveSession(session_id, "chat"))
    try:
        yield session_id
    finally:
        gateway.sessions.remove(session_id)


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
    with _registered_chat(gateway) as session_id:
        try:
            request = validate_chat(gateway, raw)
            ticket = submit(gateway, session_id)
        except ProtocolError as exc:
            full = exc.code in (ErrorCode.QUEUE_FULL, ErrorCode.NO_WORKERS)
            await fail(ws, exc.message, exc.code, CLOSE_TRY_AGAIN if full else 1000)
            return
        try:
            await race(
                _serve_chat_ws(gateway, ws, ticket, request),
                lambda: until_shutdown(gateway, until_disconnect(ws)),
            )
        except (PeerGone, WebSocketDisconnect, OSError):
            return  # the client left; the ticket or lease was given back on the way out
        except ServerShutdown:
            await tell_shutdown(ws)  # the worker keeps what was generated (interrupted)
            return
        except LookupError:
            await fail(ws, "removed from the queue by an administrator", ErrorCode.CANCELLED)
            return
        await close_quietly(ws)


async def _serve_chat_ws(
    gateway: Gateway, ws: WebSocket, ticket: Ticket, request: ChatRequest
) -> None:
    lease = await gateway.pool.acquire(ticket, lambda m: send_json(ws, m))
    end = SessionEnd.LOST
    try:
        async with open_worker_session(gateway.settings, lease, "chat") as worker:
            await worker.send(request.model_dump_json())
            end = await relay_to_client(worker, ws.send_text)
    except WorkerConnectError as exc:
        await fail(ws, str(exc), ErrorCode.WORKER_FAILED)
    except asyncio.CancelledError:
        end = SessionEnd.FAILED  # the client left: not a sign of a dead worker
        raise
    finally:
        release_lease(gateway.pool, lease, end, ok=end is SessionEnd.OK)
    if end is SessionEnd.LOST:
        # The chat id is the recording id; its writer died with the worker. Closed
        # before the client is told: once it leaves, this task is cancelled.
        await asyncio.to_thread(recover_abandoned, gateway.settings.data_dir, lease.session_id)
        await fail(
            ws, f"worker {lease.worker_id} failed during the request", ErrorCode.WORKER_FAILED
        )


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


@router.post("/api/chat")
async def chat_http(request: Request) -> JSONResponse:
    """Non-streaming chat: waits in the queue, answers with the whole result."""
    gateway = gateway_of(request)
    try:
        require_enabled(request, "turnbased")
    except AppDisabled as exc:
        return _error_response(403, exc.message, ErrorCode.APP_DISABLED)
    limit = gateway.settings.limits.max_message_bytes
    body = await _read_capped(request, limit)
    if body is None:
        return _error_response(413, f"body exceeds {limit} bytes", "payload_too_large")
    with _registered_chat(gateway) as session_id:
        try:
            chat = validate_chat(gateway, body)
            ticket = submit(gateway, session_id)
        except ProtocolError as exc:
            status = {
                ErrorCode.QUEUE_FULL: 503,
                ErrorCode.NO_WORKERS: 503,
                ErrorCode.PAYLOAD_TOO_LARGE: 413,
            }.get(exc.code, 400)
            return _error_response(status, exc.message, exc.code)
        try:
            work = _serve_chat_http(gateway, ticket, chat)
            return await race(
                work, lambda: until_shutdown(gateway, _until_http_disconnect(request))
            )
        except PeerGone:
            return _error_response(499, "client disconnected", "client_closed")
        except ServerShutdown:
            return _error_response(503, "the server is shutting down", ErrorCode.SERVER_SHUTDOWN)
        except LookupError:
            return _error_response(409, "removed from the queue by an administrator", "cancelled")


async def _read_capped(request: Request, limit: int) -> bytes | None:
    """The body, or None once it exceeds ``limit`` (declared or streamed)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)


async def _serve_chat_http(gateway: Gateway, ticket: Ticket, chat: ChatRequest) -> JSONResponse:
    queued_at = time.perf_counter()

    async def ignore(_: dict[str, Any]) -> None:
        return None

    estimated_wait_s = gateway.pool.scheduler.estimates().get(ticket.ticket_id, 0.0)
    lease = await gateway.pool.acquire(ticket, ignore)
    queue_wait_ms = (time.perf_counter() - queued_at) * 1000
    messages: list[dict[str, Any]] = []

    async def collect(text: str) -> None:
        messages.append(json.loads(text))

    end = SessionEnd.LOST
    try:
        async with open_worker_session(gateway.settings, lease, "chat") as worker:
            await worker.send(chat.model_copy(update={"streaming": False}).model_dump_json())
            end = await relay_to_client(worker, collect)
    except WorkerConnectError as exc:
        return _error_response(502, str(exc), ErrorCode.WORKER_FAILED)
    except asyncio.CancelledError:
        end = SessionEnd.FAILED  # the client left: not a sign of a dead worker
        raise
    finally:
        release_lease(gateway.pool, lease, end, ok=end is SessionEnd.OK)
    final = messages[-1] if messages else {}
    if end is SessionEnd.OK and final.get("type") == "done":
        return JSONResponse(_answer(final, queue_wait_ms, estimated_wait_s))
    if final.get("type") == "error":
        status = 422 if final.get("code") in ("unsupported_capability", "invalid_request") else 502
        return _error_response(status, final["error"], final.get("code", "inference_error"))
    response = _error_response(502, f"worker {lease.worker_id} failed", ErrorCode.WORKER_FAILED)
    if end is SessionEnd.LOST:  # close the dead worker's recording once the client has its answer
        data_dir = gateway.settings.data_dir
        response.background = BackgroundTask(recover_abandoned, data_dir, lease.session_id)
    return response

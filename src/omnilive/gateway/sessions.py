"""Long-lived sessions (half-duplex, duplex) through the gateway: queue, then a
two-way relay to the leased worker. The gateway checks every client message
against the mode's typed protocol before it reaches a worker; media stays
base64 and is never decoded here. A session of a disabled app is refused
(close 1008), at connect or when a message hook finds out (``AppDisabled``).
A graceful shutdown ends each session with ``error{code: server_shutdown}``
(close 1001), queued or active; the worker then finalizes its recording."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.asyncio.client import ClientConnection

from omnilive.apps import app_of
from omnilive.config import RequestType
from omnilive.gateway.app_gate import AppDisabled, refuse, require_enabled
from omnilive.gateway.auth import principal_of
from omnilive.gateway.bridge import (
    SessionEnd,
    WorkerConnectError,
    open_worker_session,
    relay_to_client,
    release_lease,
)
from omnilive.gateway.client_ws import CLOSE_TRY_AGAIN, close_quietly, fail, send_json
from omnilive.gateway.limits import check_message
from omnilive.gateway.registry import ActiveSession
from omnilive.gateway.scheduler import NoWorkersError, QueueFullError
from omnilive.gateway.state import Gateway
from omnilive.ids import is_safe_id
from omnilive.logs import bind_session
from omnilive.protocol.common import ErrorCode, ProtocolError, error_message
from omnilive.recording.recovery import RecordingIdNote, recover_abandoned
from omnilive.wsutil import PeerGone, frames_of, race

# Validates one client frame; returns the typed message (it has a ``type``).
Validator = Callable[[str | bytes], Any]
# Sees every valid client message, e.g. to learn the session's mode from prepare;
# it may raise AppDisabled to end the session (the message is not forwarded).
MessageHook = Callable[[ActiveSession, Any], None]
T = TypeVar("T")
CLOSE_GOING_AWAY = 1001
SHUTDOWN_MESSAGE = "the server is shutting down; reconnect shortly"


class ServerShutdown(Exception):
    """The gateway began a graceful shutdown while the session was open."""


async def until_shutdown(gateway: Gateway, work: Awaitable[T]) -> T:
    """``work``'s result, or :class:`ServerShutdown` if the gateway starts
    shutting down first (``work`` is then cancelled)."""
    try:
        return await race(work, gateway.shutting_down.wait)
    except PeerGone:
        raise ServerShutdown() from None


async def tell_shutdown(ws: WebSocket) -> None:
    await fail(ws, SHUTDOWN_MESSAGE, ErrorCode.SERVER_SHUTDOWN, CLOSE_GOING_AWAY)


async def serve_session(
    gateway: Gateway,
    ws: WebSocket,
    session_id: str,
    kind: RequestType,
    validate: Validator,
    on_message: MessageHook | None = None,
    early_types: tuple[str, ...] = ("prepare",),
) -> None:
    """Queue (always ending with ``queue_done``), then relay until either side ends."""
    await ws.accept()
    if not is_safe_id(session_id):
        await fail(ws, "session id must be 1-128 of A-Z a-z 0-9 _ -", ErrorCode.INVALID_REQUEST)
        return
    bind_session(session_id)
    limits = gateway.settings.limits

    def checked(raw: str | bytes) -> Any:
        message = validate(raw)
        check_message(message, limits)
        return message

    try:
        require_enabled(ws, app_of(kind))
    except AppDisabled as exc:
        await refuse(ws, exc)
        return
    session = ActiveSession(session_id, kind, owner=principal_of(ws).key_id)
    try:
        gateway.sessions.add(session)
    except ProtocolError as exc:
        await fail(ws, exc.message, exc.code)
        return
    try:

        def observe(message: Any) -> None:
            if on_message is not None:
                on_message(session, message)

        try:
            ticket = session.ticket = gateway.pool.submit(kind, session_id)
        except (QueueFullError, NoWorkersError) as exc:
            code = ErrorCode.QUEUE_FULL if isinstance(exc, QueueFullError) else ErrorCode.NO_WORKERS
            await fail(ws, str(exc), code, CLOSE_TRY_AGAIN)
            return
        early: list[str | bytes] = []
        try:
            lease = await race(
                gateway.pool.acquire(ticket, lambda m: send_json(ws, m), always_done=True),
                lambda: until_shutdown(
                    gateway, _hold_while_queued(ws, checked, observe, early, early_types)
                ),
            )
        except (PeerGone, WebSocketDisconnect, OSError):
            return
        except ServerShutdown:
            await tell_shutdown(ws)
            return
        except LookupError:
            await fail(ws, "removed from the queue by an administrator", ErrorCode.CANCELLED)
            return
        except AppDisabled as exc:
            await refuse(ws, exc)
            return
        session.lease = lease
        if lease.request_type != session.kind:  # a prepare while queued changed it
            gateway.pool.retype(None, lease, session.kind)
        await _relay(gateway, ws, session, lease, early, checked, observe)
    finally:
        gateway.sessions.remove(session_id)


async def _valid_messages(
    ws: WebSocket, validate: Validator
) -> AsyncIterator[tuple[str | bytes, Any]]:
    """Each client frame with its typed message. A frame that fails
    ``validate`` is answered with its error and skipped: a bad message does
    not end the session."""
    async for raw in frames_of(ws):
        try:
            message = validate(raw)
        except ProtocolError as exc:
            await send_json(ws, error_message(exc.message, exc.code))
            continue
        yield raw, message


async def _hold_while_queued(
    ws: WebSocket,
    validate: Validator,
    observe: Callable[[Any], None],
    early: list[str | bytes],
    early_types: tuple[str, ...],
) -> None:
    """While queued: keep the newest early message (a prepare sent before
    ``queue_done``) for the worker; refuse everything else with ``not_ready``."""
    async for raw, message in _valid_messages(ws, validate):
        if message.type in early_types:
            observe(message)
            early[:] = [raw]
        else:
            await send_json(ws, error_message("wait for queue_done", ErrorCode.NOT_READY))


async def _forward_client(
    ws: WebSocket, worker: ClientConnection, validate: Validator, observe: Callable[[Any], None]
) -> None:
    async for raw, message in _valid_messages(ws, validate):
        observe(message)
        await worker.send(raw)


async def _relay(
    gateway: Gateway,
    ws: WebSocket,
    session: ActiveSession,
    lease: Any,
    early: list[str | bytes],
    validate: Validator,
    observe: Callable[[Any], None],
) -> None:
    end = SessionEnd.LOST
    refused: AppDisabled | None = None
    recording = RecordingIdNote()  # the worker announces the id in ``prepared``
    try:
        async with open_worker_session(gateway.settings, lease, session.kind) as worker:
            session.worker = worker
            for raw in early:
                await worker.send(raw)
            down = asyncio.ensure_future(relay_to_client(worker, ws.send_text, recording.note))
            up = asyncio.ensure_future(_forward_client(ws, worker, validate, observe))
            stop = asyncio.ensure_future(gateway.shutting_down.wait())
            try:
                await asyncio.wait([down, up, stop], return_when="FIRST_COMPLETED")
            finally:
                up.cancel()
                stop.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await up
                with contextlib.suppress(asyncio.CancelledError):
                    await stop
            if up.done() and not up.cancelled() and isinstance(up.exception(), AppDisabled):
                refused = up.exception()  # type: ignore[assignment]
            if not down.done():
                # The client left, or the server is going away: closing the
                # worker socket ends its runner, which finalizes the recording.
                if gateway.shutting_down.is_set():
                    await tell_shutdown(ws)
                await worker.close()
                down.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await down
                end = SessionEnd.OK
            else:
                end = down.result()
    except WorkerConnectError as exc:
        await fail(ws, str(exc), ErrorCode.WORKER_FAILED)
    except (WebSocketDisconnect, OSError):
        end = SessionEnd.OK
    finally:
        session.worker = None
        release_lease(gateway.pool, lease, end, ok=end is not SessionEnd.LOST)
    if end is SessionEnd.LOST:
        await fail(
            ws, f"worker {lease.worker_id} failed during the session", ErrorCode.WORKER_FAILED
        )
        if recording.recording_id is not None:  # its writer died with the worker
            await asyncio.to_thread(
                recover_abandoned, gateway.settings.data_dir, recording.recording_id
            )
    elif refused is not None:
        await refuse(ws, refused)
    else:
        await close_quietly(ws)

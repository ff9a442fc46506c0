"""Long-lived sessions (half-duplex, duplex) through the gateway: queue, then a
two-way relay to the leased worker. The gateway checks every client message
against the mode's typed protocol before it reaches a worker, and sends it on
as the client sent it; but an ``audio_chunk`` goes as one binary frame, its
media decoded from base64 here (``protocol/media_frame.py``), so that the
worker's event loop, which every session of its GPU shares, parses neither
its JSON nor its base64 (``binary_media``: off, as it came). A session of a disabled app is refused
(close 1008), at connect or when a message hook finds out (``AppDisabled``).
A graceful shutdown ends each session with ``error{code: server_shutdown}``
(close 1001), queued or active; the worker then finalizes its recording."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from starlette.websockets import WebSocket

from omnilive.apps import app_of
from omnilive.config import RequestType
from omnilive.gateway.app_gate import CLOSE_POLICY_VIOLATION, require_enabled
from omnilive.gateway.auth import principal_of
from omnilive.gateway.client_channel import ClientChannel
from omnilive.gateway.client_ws import CLOSE_TRY_AGAIN, close_quietly, fail, send_json
from omnilive.gateway.lifecycle import Ending
from omnilive.gateway.limits import check_message
from omnilive.gateway.registry import ActiveSession
from omnilive.gateway.resume_link import CLOSE_POLICY_VIOLATION as CLOSE_REFUSED
from omnilive.gateway.resume_link import client_channel, serve_resume
from omnilive.gateway.session_link import (
    SessionLink,
    Tell,
    WorkerSocket,
    gateway_session,
    until_shutdown,
)
from omnilive.gateway.state import Gateway
from omnilive.ids import is_safe_id
from omnilive.logs import bind_session
from omnilive.protocol.common import ErrorCode, ProtocolError, error_message
from omnilive.protocol.media_frame import encode_media, media_message
from omnilive.wsutil import race

# Validates one client frame; returns the typed message (it has a ``type``).
Validator = Callable[[str | bytes], Any]
# What the worker is sent for a valid client frame (the frame, its message).
ForWorker = Callable[[str | bytes, Any], str | bytes]
# Sees every valid client message, e.g. to learn the session's mode from prepare;
# it may raise AppDisabled to end the session (the message is not forwarded).
MessageHook = Callable[[ActiveSession, Any], None]
CLOSE_GOING_AWAY = 1001

# How the chat, half-duplex and duplex protocols tell a client that the
# gateway ended its session: an ``error`` with this code, then this close code.
_TOLD = {
    Ending.QUEUE_FULL: (ErrorCode.QUEUE_FULL, CLOSE_TRY_AGAIN),
    Ending.NO_WORKERS: (ErrorCode.NO_WORKERS, CLOSE_TRY_AGAIN),
    Ending.CANCELLED: (ErrorCode.CANCELLED, 1000),
    Ending.APP_DISABLED: (ErrorCode.APP_DISABLED, CLOSE_POLICY_VIOLATION),
    Ending.SHUTDOWN: (ErrorCode.SERVER_SHUTDOWN, CLOSE_GOING_AWAY),
    Ending.WORKER_UNREACHABLE: (ErrorCode.WORKER_FAILED, 1000),
    Ending.WORKER_LOST: (ErrorCode.WORKER_FAILED, 1000),
    Ending.INTERNAL_ERROR: (ErrorCode.WORKER_FAILED, 1000),
}


def tell_plain(ws: WebSocket | ClientChannel) -> Tell:
    """``tell`` for the chat, half-duplex and duplex protocols. A busy worker
    already sent the client its error; the socket just closes."""

    async def tell(ending: Ending, detail: str) -> None:
        if ending in _TOLD:
            code, close_code = _TOLD[ending]
            await fail(ws, detail, code, close_code)
        await close_quietly(ws)

    return tell


async def serve_session(
    gateway: Gateway,
    ws: WebSocket,
    session_id: str,
    kind: RequestType,
    validate: Validator,
    on_message: MessageHook | None = None,
    early_types: tuple[str, ...] = ("prepare",),
) -> None:
    """Queue (always ending with ``queue_done``), then relay until either
    side ends; or, for a connection with a resume token, resume a session."""
    await ws.accept()

    async def refuse(exc: ProtocolError) -> None:
        await fail(ws, exc.message, exc.code, CLOSE_REFUSED)

    route = "half_duplex" if kind == "half_duplex" else "duplex"
    if await serve_resume(gateway, ws, route, refuse):
        return
    if not is_safe_id(session_id):
        await fail(ws, "session id must be 1-128 of A-Z a-z 0-9 _ -", ErrorCode.INVALID_REQUEST)
        return
    bind_session(session_id)
    limits = gateway.settings.limits

    def checked(raw: str | bytes) -> Any:
        message = validate(raw)
        check_message(message, limits)
        return message

    session = ActiveSession(session_id, kind, owner=principal_of(ws).key_id)

    def observe(message: Any) -> None:
        if on_message is not None:
            on_message(session, message)

    to_worker = binary_media if gateway.settings.binary_media else as_sent
    reader = _Reader(checked, to_worker, observe)
    async with client_channel(gateway, ws, session, route) as channel:
        try:
            async with gateway_session(gateway, session, tell_plain(channel), channel) as link:
                require_enabled(ws, app_of(kind))
                if link.submit():
                    await _serve(link, channel, reader, early_types)
        except ProtocolError as exc:  # the session id is in use
            await fail(channel, exc.message, exc.code)
            return
        await close_quietly(channel)


def as_sent(raw: str | bytes, message: Any) -> str | bytes:
    """A client frame for the worker as the client sent it."""
    return raw


def binary_media(raw: str | bytes, message: Any) -> str | bytes:
    """A client frame for the worker: an ``audio_chunk`` as one media frame,
    anything else (and a chunk whose base64 the worker will refuse) as sent."""
    media = media_message(message)
    return raw if media is None else encode_media(media)


class _Reader:
    """How a session reads its client: each frame checked (``validate``),
    seen (``observe``) and made into what its worker is sent (``to_worker``)."""

    def __init__(self, validate: Validator, to_worker: ForWorker, observe: Callable[[Any], None]):
        self.validate = validate
        self.to_worker = to_worker
        self.observe = observe

    async def messages(self, ws: ClientChannel) -> AsyncIterator[tuple[str | bytes, Any]]:
        """Each valid client frame, as its worker gets it, with its typed
        message, across resumes. A frame that fails ``validate`` is answered
        with its error and skipped: a bad message does not end the session."""
        async for raw in ws.frames():
            try:
                message = self.validate(raw)
            except ProtocolError as exc:
                await send_json(ws, error_message(exc.message, exc.code))
                continue
            yield self.to_worker(raw, message), message


async def _serve(
    link: SessionLink, ws: ClientChannel, reader: _Reader, early_types: tuple[str, ...]
) -> None:
    early = _Early(early_types)

    async def queue_to_client(message: dict[str, Any]) -> None:
        early.served = message["type"] == "queue_done"
        await send_json(ws, message)

    gateway = link.gateway
    await race(
        link.acquire(queue_to_client, always_done=True),
        lambda: until_shutdown(gateway, _hold_while_queued(ws, reader, early)),
    )
    async with link.worker() as worker:
        for frame in early:
            await worker.send(frame)
        link.end(await _relay(link, ws, worker, reader))


# Messages kept for the worker between ``queue_done`` and its socket being open.
MAX_EARLY = 32


class _Early:
    """What a session's client sent before its worker socket was open: the
    newest early-allowed message (a prepare) while queued, and everything
    once ``queue_done`` went out (a client may send at once, before the
    socket to its worker is up)."""

    def __init__(self, types: tuple[str, ...]) -> None:
        self.types = types
        self.served = False
        self.frames: list[str | bytes] = []

    def __iter__(self) -> Iterator[str | bytes]:
        return iter(self.frames)


async def _hold_while_queued(ws: ClientChannel, reader: _Reader, early: _Early) -> None:
    """While queued: keep the newest early message for the worker and refuse
    everything else with ``not_ready``; once served, keep everything."""
    async for frame, message in reader.messages(ws):
        if early.served:
            reader.observe(message)
            early.frames = [*early.frames, frame][-MAX_EARLY:]
        elif message.type in early.types:
            reader.observe(message)
            early.frames = [frame]
        else:
            await send_json(ws, error_message("wait for queue_done", ErrorCode.NOT_READY))


async def _forward_client(ws: ClientChannel, worker: WorkerSocket, reader: _Reader) -> None:
    async for frame, message in reader.messages(ws):
        reader.observe(message)  # may raise AppDisabled: the session ends
        await worker.send(frame)


async def _relay(
    link: SessionLink, ws: ClientChannel, worker: WorkerSocket, reader: _Reader
) -> Ending:
    """Both ways until the worker ends the session (how it did), the client
    leaves, or the server shuts down (both end it here, and the worker,
    seeing its socket close, finalizes its recording)."""

    async def to_client(_: Any, payload: str) -> None:
        await ws.send_text(payload)

    async def from_client() -> Ending:
        await until_shutdown(link.gateway, _forward_client(ws, worker, reader))
        return Ending.CLIENT_LEFT

    name = link.session.session_id
    down = asyncio.create_task(worker.relay(to_client), name=f"{name}:from-worker")
    up = asyncio.create_task(from_client(), name=f"{name}:from-client")
    ws.set_resumable(True)  # a dropped client now suspends the session
    try:
        done, _ = await asyncio.wait([down, up], return_when="FIRST_COMPLETED")
    finally:
        ws.set_resumable(False)
        for task in (up, down):
            task.cancel()
        await asyncio.gather(up, down, return_exceptions=True)
    if down in done:
        return down.result()
    # The client left, or its side ended the session (AppDisabled,
    # ServerShutdown, raised here); closing the socket tells the worker,
    # which then finalizes its recording.
    await worker.close()
    return up.result()

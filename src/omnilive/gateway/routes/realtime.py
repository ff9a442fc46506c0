"""The Realtime API: ``WS /v1/realtime?mode=video|audio``.

This module does the I/O; the rules live in ``gateway/realtime_machine.py``.
The session's total life (queueing included) is limited by mode, and a
graceful server shutdown ends it with ``server_shutdown``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from typing import Any, Literal

from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect
from websockets.asyncio.client import ClientConnection

from omnilive.gateway.app_gate import CLOSE_POLICY_VIOLATION, AppDisabled, require_enabled
from omnilive.gateway.bridge import (
    SessionEnd,
    WorkerConnectError,
    open_worker_session,
    relay_to_client,
    release_lease,
)
from omnilive.gateway.client_ws import CLOSE_TRY_AGAIN, close_quietly
from omnilive.gateway.realtime_machine import Action, Close, RealtimeMachine, ToClient, ToWorker
from omnilive.gateway.registry import ActiveSession
from omnilive.gateway.scheduler import Lease, NoWorkersError, QueueFullError
from omnilive.gateway.state import Gateway, gateway_of
from omnilive.ids import mint_realtime
from omnilive.logs import bind_session
from omnilive.protocol.realtime import CloseReason, RealtimeErrorCode, error_event
from omnilive.recording.recovery import RecordingIdNote, recover_abandoned
from omnilive.wsutil import frames_of

router = APIRouter()
_TYPE = re.compile(r'^\{"type": "([^"]+)"')


class SessionDone(Exception):
    """Raised inside the session to end it after its actions were carried out."""


def event_type(raw: str) -> str:
    """The ``type`` of an event our worker wrote (it always comes first)."""
    match = _TYPE.match(raw)
    return match.group(1) if match else ""


class RealtimeConnection:
    """One client connection, from accept to close."""

    def __init__(self, gateway: Gateway, ws: WebSocket, mode: Literal["video", "audio"]):
        self.gateway = gateway
        self.ws = ws
        limits = gateway.settings.realtime
        self.machine = RealtimeMachine(mode, mint_realtime(), limits.context_tokens)
        self.limit_s = limits.video_max_s if mode == "video" else limits.audio_max_s
        self.worker: ClientConnection | None = None

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send_text(json.dumps(event))

    async def apply(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, ToClient):
                await self.send(action.event)
            elif isinstance(action, ToWorker):
                if self.worker is not None:
                    await self.worker.send(json.dumps(action.message))
            elif isinstance(action, Close):
                await close_quietly(self.ws, action.code)
                raise SessionDone()

    async def refuse(self, code: RealtimeErrorCode, message: str) -> None:
        """A server-side refusal: error, then close 1013 (try again later)."""
        with contextlib.suppress(WebSocketDisconnect, OSError, RuntimeError):
            await self.send(error_event(code, message))
        await close_quietly(self.ws, CLOSE_TRY_AGAIN)

    async def run(self) -> None:
        bind_session(self.machine.session_id)
        session = ActiveSession(self.machine.session_id, self.machine.task_type)
        self.gateway.sessions.add(session)
        try:
            async with asyncio.timeout(self.limit_s):
                await self._serve(session)
        except TimeoutError:
            await self._end(CloseReason.TIMEOUT)
        except SessionDone:
            pass
        except (WebSocketDisconnect, OSError):
            return
        finally:
            self.gateway.sessions.remove(self.machine.session_id)

    async def _end(self, reason: CloseReason) -> None:
        with contextlib.suppress(SessionDone, WebSocketDisconnect, OSError, RuntimeError):
            await self.apply(self.machine.end(reason))

    async def _serve(self, session: ActiveSession) -> None:
        pool = self.gateway.pool
        try:
            ticket = session.ticket = pool.submit(self.machine.task_type, self.machine.session_id)
        except QueueFullError as exc:
            await self.refuse(RealtimeErrorCode.QUEUE_FULL, str(exc))
            return
        except NoWorkersError as exc:
            await self.refuse(RealtimeErrorCode.SERVICE_UNAVAILABLE, str(exc))
            return

        async def queue_to_client(message: dict[str, Any]) -> None:
            await self.apply([self.machine.queue_event(message)])

        waiting = asyncio.ensure_future(pool.acquire(ticket, queue_to_client, always_done=True))
        lease = await self._while(waiting)
        if lease is None:
            return
        session.lease = lease
        await self._relay(lease)

    async def _while(self, work: asyncio.Future[Any]) -> Any:
        """Run ``work`` while reading the client (through the machine) and
        watching for shutdown; returns its result, or None if the session ended."""
        reader = asyncio.ensure_future(self._read_client())
        shutdown = asyncio.ensure_future(self.gateway.shutting_down.wait())
        try:
            await asyncio.wait([work, reader, shutdown], return_when="FIRST_COMPLETED")
        finally:
            for task in (work, reader, shutdown):
                if not task.done():
                    task.cancel()
            await asyncio.gather(work, reader, shutdown, return_exceptions=True)
        if shutdown.done() and not shutdown.cancelled():
            await self._end(CloseReason.SERVER_SHUTDOWN)
            return None
        if reader.done() and not reader.cancelled() and reader.exception():
            raise reader.exception()  # type: ignore[misc]
        if work.done() and not work.cancelled():
            return work.result()
        return None

    async def _read_client(self) -> None:
        async for raw in frames_of(self.ws):
            await self.apply(self.machine.client_frame(raw))

    async def _relay(self, lease: Lease) -> None:
        end = SessionEnd.LOST
        recording = RecordingIdNote()  # announced in session.created
        try:
            async with open_worker_session(self.gateway.settings, lease, lease.request_type) as w:
                self.worker = w

                async def to_client(raw: str) -> None:
                    recording.note(raw)
                    kind = event_type(raw)
                    if self.machine.forwards(kind):
                        await self.ws.send_text(raw)
                    await self.apply(self.machine.worker_event(kind))

                end = await self._while(asyncio.ensure_future(relay_to_client(w, to_client)))
        except WorkerConnectError as exc:
            await self.refuse(RealtimeErrorCode.WORKER_CONNECT_FAILED, str(exc))
        except SessionDone:
            end = SessionEnd.OK
            raise
        finally:
            self.worker = None
            ok = end in (SessionEnd.OK, SessionEnd.FAILED)
            release_lease(self.gateway.pool, lease, end, ok)
        if end is SessionEnd.REFUSED:
            await self.refuse(RealtimeErrorCode.WORKER_BUSY, f"worker {lease.worker_id} is busy")
        elif end is SessionEnd.LOST:
            with contextlib.suppress(WebSocketDisconnect, OSError, RuntimeError):
                await self.send(
                    error_event(
                        RealtimeErrorCode.SERVICE_UNAVAILABLE,
                        f"worker {lease.worker_id} failed during the session",
                    )
                )
            await self._end(CloseReason.ERROR)
            if recording.recording_id is not None:  # its writer died with the worker
                data_dir = self.gateway.settings.data_dir
                await asyncio.to_thread(recover_abandoned, data_dir, recording.recording_id)
        elif end is SessionEnd.FAILED:
            await self._end(CloseReason.ERROR)


@router.websocket("/v1/realtime")
async def realtime_ws(ws: WebSocket, mode: str = "video") -> None:
    gateway = gateway_of(ws)
    await ws.accept()
    if mode not in ("video", "audio"):
        await ws.send_text(
            json.dumps(
                error_event(RealtimeErrorCode.INVALID_PAYLOAD, "mode must be video or audio")
            )
        )
        await close_quietly(ws, 1008)
        return
    try:
        require_enabled(ws, "realtime")
    except AppDisabled as exc:
        await ws.send_text(json.dumps(error_event(RealtimeErrorCode.APP_DISABLED, exc.message)))
        await close_quietly(ws, CLOSE_POLICY_VIOLATION)
        return
    await RealtimeConnection(gateway, ws, mode).run()  # type: ignore[arg-type]

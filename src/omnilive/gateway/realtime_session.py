"""A Realtime API video or audio session: the I/O around its machine.

The session speaks the dialect of its first event that tells the two apart
(``session.init`` and ``input.append`` are the newer one's, ``session.update``,
``input_audio_buffer.append`` and ``response.cancel`` the older one's); until
then it follows the older, whose queue events and errors both dialects share.
Once it has a worker, client events go to it as duplex messages and the
worker's events (already in the session's dialect) come back as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any, Literal

from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect
from websockets.asyncio.client import ClientConnection

from omnilive.gateway.bridge import (
    SessionEnd,
    WorkerConnectError,
    open_worker_session,
    relay_to_client,
    release_lease,
)
from omnilive.gateway.realtime_io import RealtimeIO, SessionDone
from omnilive.gateway.realtime_machine import Action, RealtimeMachine, ToWorker
from omnilive.gateway.realtime_v2_machine import RealtimeV2Machine
from omnilive.gateway.registry import ActiveSession
from omnilive.gateway.scheduler import Lease
from omnilive.gateway.state import Gateway
from omnilive.ids import mint_realtime
from omnilive.protocol.internal import Envelope
from omnilive.protocol.realtime import (
    V1_EVENT_TYPES,
    CloseReason,
    RealtimeErrorCode,
    error_event,
)
from omnilive.protocol.realtime_v2 import V2_EVENT_TYPES
from omnilive.recording.recovery import RecordingIdNote, recover_abandoned


def event_kind(raw: str | bytes) -> str | None:
    """The ``type`` of a client event, if it is a JSON object with one."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    kind = data.get("type") if isinstance(data, dict) else None
    return kind if isinstance(kind, str) else None


class RealtimeConnection(RealtimeIO):
    """One video or audio client connection, from accept to close."""

    def __init__(self, gateway: Gateway, ws: WebSocket, mode: Literal["video", "audio"]):
        super().__init__(gateway, ws)
        limits = gateway.settings.realtime
        self.machine: RealtimeMachine | RealtimeV2Machine = RealtimeMachine(
            mode, mint_realtime(), limits.context_tokens
        )
        self.dialect_known = False
        self.limit_s = limits.video_max_s if mode == "video" else limits.audio_max_s
        self.worker: ClientConnection | None = None

    def client_frame(self, raw: str | bytes) -> list[Action]:
        """Through the machine of the session's dialect, chosen by its first
        event that tells (``session.close`` and queue events do not)."""
        if not self.dialect_known:
            kind = event_kind(raw)
            if kind in V2_EVENT_TYPES:
                self.machine = RealtimeV2Machine.taking_over(self.machine)
            self.dialect_known = kind in V2_EVENT_TYPES or kind in V1_EVENT_TYPES
        return self.machine.client_frame(raw)

    async def act(self, action: Any) -> None:
        if isinstance(action, ToWorker):
            if self.worker is not None:
                await self.worker.send(json.dumps(action.message))
            return
        await super().act(action)

    async def serve_leased(self, session: ActiveSession, lease: Lease) -> None:
        end = SessionEnd.LOST
        recording = RecordingIdNote()  # announced in session.created
        try:
            async with open_worker_session(self.gateway.settings, lease, lease.request_type) as w:
                self.worker = w
                await self.apply(self.machine.attach_worker())

                envelopes: list[Envelope] = []  # the envelope of the message in hand

                def observe(envelope: Envelope) -> None:
                    recording.note(envelope)
                    envelopes[:] = [envelope]

                async def to_client(payload: str) -> None:
                    envelope = envelopes[0]
                    if self.machine.forwards(envelope.type):
                        await self.ws.send_text(payload)
                    await self.apply(self.machine.worker_event(envelope))

                relay = asyncio.ensure_future(relay_to_client(w, to_client, observe))
                end = await self.while_reading(relay)
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
            if self.machine.dialect == "realtime":  # the newer dialect has no error events
                with contextlib.suppress(WebSocketDisconnect, OSError, RuntimeError):
                    message = f"worker {lease.worker_id} failed during the session"
                    await self.send(error_event(RealtimeErrorCode.SERVICE_UNAVAILABLE, message))
            await self.end(CloseReason.ERROR)
            if recording.recording_id is not None:  # its writer died with the worker
                data_dir = self.gateway.settings.data_dir
                await asyncio.to_thread(recover_abandoned, data_dir, recording.recording_id)
        elif end is SessionEnd.FAILED:
            await self.end(CloseReason.ERROR)

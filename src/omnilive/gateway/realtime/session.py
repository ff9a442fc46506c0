"""A Realtime API video or audio session: the I/O around its machine.

The session speaks the dialect of its first event that tells the two apart
(``session.init`` and ``input.append`` are the newer one's, ``session.update``,
``input_audio_buffer.append`` and ``response.cancel`` the older one's); until
then it follows the older, whose queue events and errors both dialects share.
Once it has a worker, client events go to it as duplex messages and the
worker's events (already in the session's dialect) come back as they are.
"""

from __future__ import annotations

from typing import Literal

from fastapi import WebSocket

from omnilive.gateway.lifecycle import Ending
from omnilive.gateway.realtime.connection import RealtimeIO
from omnilive.gateway.realtime.machine import Action, RealtimeMachine
from omnilive.gateway.realtime.v2_machine import RealtimeV2Machine
from omnilive.gateway.session_link import SessionLink
from omnilive.gateway.state import Gateway
from omnilive.ids import mint_realtime
from omnilive.protocol.common import ProtocolError, load_json
from omnilive.protocol.internal import Envelope
from omnilive.protocol.realtime import (
    V1_EVENT_TYPES,
    CloseReason,
)
from omnilive.protocol.realtime_v2 import V2_EVENT_TYPES


def event_kind(raw: str | bytes, max_bytes: int) -> str | None:
    """The ``type`` of a client event, if it is a JSON object with one."""
    try:
        data = load_json(raw, max_bytes)
    except ProtocolError:
        return None
    kind = data.get("type") if isinstance(data, dict) else None
    return kind if isinstance(kind, str) else None


class RealtimeConnection(RealtimeIO):
    """One video or audio client connection, from accept to close."""

    def __init__(self, gateway: Gateway, ws: WebSocket, mode: Literal["video", "audio"]):
        super().__init__(gateway, ws)
        limits = gateway.settings.realtime
        self.machine: RealtimeMachine | RealtimeV2Machine = RealtimeMachine(
            mode, mint_realtime(), limits.context_tokens, gateway.settings.limits.max_message_bytes
        )
        self.dialect_known = False
        self.limit_s = limits.video_max_s if mode == "video" else limits.audio_max_s

    def client_frame(self, raw: str | bytes) -> list[Action]:
        """Through the machine of the session's dialect, chosen by its first
        event that tells (``session.close`` and queue events do not)."""
        if not self.dialect_known:
            kind = event_kind(raw, self.machine.max_bytes or len(raw))
            if kind in V2_EVENT_TYPES:
                self.machine = RealtimeV2Machine.taking_over(self.machine)
            self.dialect_known = kind in V2_EVENT_TYPES or kind in V1_EVENT_TYPES
        return self.machine.client_frame(raw)

    async def serve_leased(self, link: SessionLink) -> None:
        async def to_client(envelope: Envelope, payload: str) -> None:
            if self.machine.forwards(envelope.type):
                await self.ws.send_text(payload)
            await self.apply(self.machine.worker_event(envelope))

        ending = await self.relay_leased(link, to_client)
        if ending is not None:  # else the client left
            link.end(ending)
            if ending is Ending.FAILED:  # the worker told the client why
                await self.end(CloseReason.ERROR)

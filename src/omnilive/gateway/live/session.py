"""A Live API connection on ``/v1/live/sessions``: the I/O around its
machine (``machine.py``), on the path every Realtime connection takes
(``gateway/realtime/connection.py``: queue, leases, limits, shutdown).

The session queues only once the client's ``session.start`` arrived
(within ``limits.first_message_timeout_s``). On the worker the Live runner
speaks the dialect itself, so its events are relayed untouched, but for a
worker's failure in the common shape, which becomes a Live ``error``, and
``session.closed``, after which the socket closes. No Live client knows a
resume token: a lost connection ends the session, as on OpenAI's server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect

from omnilive.gateway.client_ws import close_quietly
from omnilive.gateway.lifecycle import Ending
from omnilive.gateway.live.machine import CLOSE_NORMAL, LiveMachine, LiveState
from omnilive.gateway.realtime.connection import RealtimeIO, SessionDone, openai_error_kind
from omnilive.gateway.session_link import SessionLink
from omnilive.gateway.state import Gateway
from omnilive.ids import mint
from omnilive.protocol.internal import Envelope
from omnilive.protocol.openai_live_events import error_event
from omnilive.protocol.realtime import CloseReason, RealtimeErrorCode


class LiveConnection(RealtimeIO):
    """One Live client connection, from accept to close."""

    resumable = False

    def __init__(self, gateway: Gateway, ws: WebSocket) -> None:
        super().__init__(gateway, ws)
        settings = gateway.settings
        self.limit_s = settings.realtime.audio_max_s
        self.machine = LiveMachine(
            mint("live", 12), settings.limits.max_message_bytes, self.limit_s
        )

    def client_frame(self, raw: str | bytes) -> list[Any]:
        actions: list[Any] = self.machine.client_frame(raw)
        return actions

    async def opened(self) -> None:
        """Read the client until its ``session.start`` is accepted; a client
        that leaves, closes or says nothing in time is not queued at all."""
        wait_s = self.gateway.settings.limits.first_message_timeout_s
        try:
            async with asyncio.timeout(wait_s):
                frames = self._channel().frames()
                async with contextlib.aclosing(frames):
                    async for raw in frames:
                        await self.apply(self.client_frame(raw))
                        if self.machine.started:
                            return
        except TimeoutError:
            message = f"no session.start within {wait_s:.0f} s"
            with contextlib.suppress(WebSocketDisconnect, OSError, RuntimeError):
                await self.send(error_event("session_expired", message))
            await close_quietly(self.ws, CLOSE_NORMAL)
        except SessionDone:  # session.close before session.start
            pass

    async def _serve(self, link: SessionLink) -> None:
        if self.machine.state is LiveState.QUEUED:
            await super()._serve(link)

    def refusal_event(self, code: RealtimeErrorCode, message: str) -> dict[str, Any]:
        return error_event(code.value, message, kind=openai_error_kind(code))

    async def serve_leased(self, link: SessionLink) -> None:
        async def to_client(envelope: Envelope, payload: str) -> None:
            if envelope.type == "error":
                payload = _live_error(payload)
            elif envelope.type == "session.closed":
                self.machine.worker_closed()
            await self.ws.send_text(payload)  # the worker speaks the dialect

        ending = await self.relay_leased(link, to_client, self.machine.worker_kind)
        if ending is None:  # the client left
            return
        link.end(ending)  # a worker lost is told by the session's path (tell)
        if self.machine.state is LiveState.CLOSED:
            await close_quietly(self.ws, CLOSE_NORMAL)
        elif ending in (Ending.FAILED, Ending.DONE):  # it ended without saying so
            await self.end(CloseReason.ERROR if ending is Ending.FAILED else CloseReason.STOPPED)


def _live_error(payload: str) -> str:
    """A worker's failure in the common shape (``error`` a string, ``code``
    beside it) as the Live ``error``; the dialect's own errors as they are."""
    message = json.loads(payload)
    if not isinstance(message.get("error"), str):
        return payload
    code = str(message.get("code") or "server_error")
    return json.dumps(error_event(code, message["error"], kind="server_error"))

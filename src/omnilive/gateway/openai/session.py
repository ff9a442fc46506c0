"""An OpenAI Realtime API (GA) connection on ``/v1/realtime``: the I/O
around its machine (``machine.py``).

The session is served on the worker by the OpenAI Realtime runner (the
half-duplex path) or, for a ``*-duplex`` model, by the duplex one; the worker
speaks the dialect itself (its presenters), so its events are relayed
untouched, but for the one message a worker sends in every protocol's shape,
its failure, which becomes an OpenAI ``error``. Refusals and server-side ends
are OpenAI-shaped ``error`` events.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import WebSocket

from omnilive.gateway.lifecycle import Ending
from omnilive.gateway.openai.machine import OpenAIRealtimeMachine
from omnilive.gateway.realtime.connection import RealtimeIO, openai_error_kind
from omnilive.gateway.session_link import SessionLink
from omnilive.gateway.state import Gateway
from omnilive.ids import mint
from omnilive.protocol.internal import Envelope
from omnilive.protocol.openai_realtime import error_event, wants_extensions
from omnilive.protocol.realtime import CloseReason, RealtimeErrorCode


class OpenAIRealtimeConnection(RealtimeIO):
    """One GA-dialect client connection, from accept to close."""

    def __init__(self, gateway: Gateway, ws: WebSocket, model: str) -> None:
        super().__init__(gateway, ws)
        max_bytes = gateway.settings.limits.max_message_bytes
        extensions = wants_extensions(ws.query_params)
        self.machine = OpenAIRealtimeMachine(mint("sess_", 12), model, max_bytes, extensions)
        self.limit_s = gateway.settings.realtime.audio_max_s
        # No OpenAI client knows a resume token: without omnilive's
        # extensions a lost connection ends the session, as on OpenAI's server.
        self.resumable = extensions

    def client_frame(self, raw: str | bytes) -> list[Any]:
        actions: list[Any] = self.machine.client_frame(raw)
        return actions

    async def opened(self) -> None:
        await self.apply(self.machine.created())

    def refusal_event(self, code: RealtimeErrorCode, message: str) -> dict[str, Any]:
        return error_event(code.value, message, kind=openai_error_kind(code))

    async def serve_leased(self, link: SessionLink) -> None:
        async def to_client(envelope: Envelope, payload: str) -> None:
            if envelope.type == "error":
                payload = _openai_error(payload)
            await self.ws.send_text(payload)  # the worker speaks the dialect

        ending = await self.relay_leased(link, to_client, self.machine.worker_kind)
        if ending is not None:  # else the client left
            link.end(ending)  # a worker lost is told by the session's path (tell)
            if ending is Ending.FAILED:  # the worker told the client why
                await self.end(CloseReason.ERROR)


def _openai_error(payload: str) -> str:
    """A worker's failure in the common shape (``error`` a string, ``code``
    beside it) as OpenAI's ``error``; the dialect's own errors as they are."""
    message = json.loads(payload)
    if not isinstance(message.get("error"), str):
        return payload
    code = str(message.get("code") or "server_error")
    return json.dumps(error_event(code, message["error"], kind="server_error"))

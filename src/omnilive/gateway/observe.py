"""An ASGI middleware that feeds :class:`GatewayMetrics` from the traffic itself.

It watches what every session connection sends its client (the messages the
workers produce, relayed, and the gateway's own), so no route has to report
anything. It stays cheap on the hot path: the message type is read from the
first bytes (every server message starts with its ``type``), errors are small
enough to parse, and a duplex result's timing fields are read from its tail,
after the audio.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from omnilive.gateway.metrics import GatewayMetrics

_TYPE = re.compile(r'\{"type": ?"([^"]{1,64})"')
_FIELD = re.compile(r'"(server_send_ts|wall_clock_ms|dropped_chunks)": ?(-?[0-9.]+)')
# A result's fields after ``audio_data`` fit in this many characters.
RESULT_TAIL = 1024
ERROR_PARSE_MAX = 16_384

_QUEUED = frozenset({"queued", "session.queued"})
_QUEUE_DONE = frozenset({"queue_done", "session.queue_done"})
_QUEUE_TYPES = _QUEUED | _QUEUE_DONE | {"queue_update", "session.queue_update"}


def mode_of(path: str) -> str | None:
    """The session mode of a WebSocket path, or None for other paths."""
    if path == "/ws/chat":
        return "chat"
    if path.startswith("/ws/half_duplex/"):
        return "half_duplex"
    if path.startswith("/ws/duplex/"):
        return "duplex"
    if path == "/v1/realtime":
        return "realtime"
    return None


def error_code(text: str) -> str:
    """The code of an error message, in the realtime or the other protocols."""
    if len(text) > ERROR_PARSE_MAX:
        return "unknown"
    try:
        message = json.loads(text)
    except ValueError:
        return "unknown"
    code = message.get("code")
    if code is None and isinstance(message.get("error"), dict):
        code = message["error"].get("code")
    return str(code or "unknown")


@dataclass
class _Connection:
    """What one session connection has shown so far."""

    mode: str
    metrics: GatewayMetrics
    opened: float
    queued_at: float | None = None
    waited: bool = False  # the queue wait was recorded
    request_at: float | None = None  # chat: the request arrived
    turn_at: float | None = None  # half-duplex: the answer started (end of speech)
    first_audio: bool = False

    def incoming(self, now: float) -> None:
        self.metrics.messages.inc(self.mode, "in")
        if self.mode == "chat" and self.request_at is None:
            self.request_at = now

    def outgoing(self, text: str, now: float) -> None:
        metrics = self.metrics
        metrics.messages.inc(self.mode, "out")
        match = _TYPE.match(text)
        kind = match.group(1) if match else ""
        if kind in _QUEUED:
            self.queued_at = now
        elif not self.waited and (kind in _QUEUE_DONE or kind not in (*_QUEUE_TYPES, "error")):
            # Served: after queue_done, or the first answer of a request never queued.
            waited = now - self.queued_at if self.queued_at is not None else 0.0
            metrics.queue_wait.observe(waited, self.mode)
            self.waited = True
        if kind == "error":
            metrics.errors.inc(self.mode, error_code(text))
        elif kind == "result":
            self._result(text)
        elif kind == "chunk":
            start = self.request_at if self.mode == "chat" else self.turn_at
            if start is not None and not self.first_audio:
                metrics.turn_latency.observe(now - start, self.mode, "first_chunk")
                self.first_audio = True
        elif kind == "generating":
            self.turn_at, self.first_audio = now, False
        elif kind in ("done", "turn_done"):
            start = self.request_at if self.mode == "chat" else self.turn_at
            if start is not None:
                metrics.turn_latency.observe(now - start, self.mode, "done")
            self.turn_at = None

    def _result(self, text: str) -> None:
        fields = dict(_FIELD.findall(text, max(0, len(text) - RESULT_TAIL)))
        metrics = self.metrics
        try:
            if "server_send_ts" in fields:
                delay = time.time() - float(fields["server_send_ts"]) / 1000
                metrics.relay_latency.observe(max(0.0, delay), self.mode)
            if "wall_clock_ms" in fields:
                metrics.unit_latency.observe(float(fields["wall_clock_ms"]) / 1000, self.mode)
            dropped = int(float(fields.get("dropped_chunks", 0)))
        except ValueError:
            return
        if dropped > 0:
            metrics.dropped_chunks.inc(self.mode, amount=dropped)


class ObserveMiddleware:
    """Counts HTTP responses, and watches session WebSockets (see module doc)."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.app(scope, receive, self._counting_http(send))
            return
        mode = mode_of(scope["path"]) if scope["type"] == "websocket" else None
        if mode is None:
            await self.app(scope, receive, send)
            return
        connection = _Connection(mode, self.metrics, time.monotonic())

        async def receiving() -> Message:
            message = await receive()
            if message["type"] == "websocket.receive":
                connection.incoming(time.monotonic())
            return message

        async def sending(message: Message) -> None:
            kind = message["type"]
            if kind == "websocket.accept":
                self.metrics.sessions_opened.inc(mode)
            await send(message)
            if kind == "websocket.send" and message.get("text"):
                # After the send: the relay delay includes handing it to the socket.
                connection.outgoing(message["text"], time.monotonic())

        await self.app(scope, receiving, sending)

    def _counting_http(self, send: Send) -> Send:
        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.http_responses.inc(str(message["status"]))
            await send(message)

        return sending

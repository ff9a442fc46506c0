"""Metrics from the sessions' traffic: an ASGI middleware, and an observer per
session connection.

The middleware counts HTTP responses, accepted sessions and frames in and
out; it reads no frame. What the frames mean the connection's
:class:`SessionObserver` learns from typed facts, reported by the code that
sends them: each message a worker sent for the client, as its
:class:`~omnilive.protocol.internal.Envelope` (``bridge.relay_to_client``),
and each message of the gateway's own (``client_ws.send_json``,
``RealtimeIO.send``). Session code finds the observer with
:func:`session_observer`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket

from omnilive.gateway.live_stats import SessionContext
from omnilive.gateway.metrics import GatewayMetrics
from omnilive.protocol.internal import Envelope

if TYPE_CHECKING:
    from omnilive.gateway.client_ws import ClientSocket

# Where the observer lives: the connection's own state (``scope["state"]``).
OBSERVER_KEY = "omnilive.session_observer"

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


class SessionObserver:
    """What one session connection has shown so far, turned into metrics.

    ``clock`` (monotonic) times the queue and the turns; ``wall_clock``
    (epoch seconds) is compared with the worker's stamp on a message."""

    def __init__(
        self,
        mode: str,
        metrics: GatewayMetrics,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.mode = mode
        self.metrics = metrics
        self.clock = clock
        self.wall_clock = wall_clock
        self.queued_at: float | None = None
        self.waited = False  # the queue wait was recorded
        self.request_at: float | None = None  # chat: the request arrived
        self.turn_at: float | None = None  # half-duplex: the answer started (end of speech)
        self.first_audio = False
        self.last_unit: int | None = None
        self.worker_id: str | None = None  # the worker serving it, once leased
        self.session_id: str | None = None  # ...and its session, set with it
        self._shown_context: str | None = None  # the session whose context the page shows

    def received(self) -> None:
        """A frame from the client (a chat request is its first)."""
        if self.mode == "chat" and self.request_at is None:
            self.request_at = self.clock()

    def relayed(self, envelope: Envelope) -> None:
        """A message a worker sent for this client, read from its envelope."""
        self._shown(envelope)
        self._unit(envelope)

    def sent(self, message: dict[str, Any]) -> None:
        """A message of the gateway's own, sent to this client. Any timings in
        it are the gateway's, not a worker's: only its type and code count."""
        self._shown(Envelope.of(message))

    def ended(self) -> None:
        """The connection ended: its session's context leaves the admin page."""
        if self._shown_context is not None:
            self.metrics.live.forget(self._shown_context)
            self._shown_context = None

    def _shown(self, envelope: Envelope) -> None:
        metrics, kind, now = self.metrics, envelope.type, self.clock()
        if kind in _QUEUED:
            self.queued_at = now
        elif not self.waited and (kind in _QUEUE_DONE or kind not in (*_QUEUE_TYPES, "error")):
            # Served: after queue_done, or the first answer of a request never queued.
            waited = now - self.queued_at if self.queued_at is not None else 0.0
            metrics.queue_wait.observe(waited, self.mode)
            self.waited = True
        if kind == "error":
            metrics.errors.inc(self.mode, envelope.code or "unknown")
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

    def _unit(self, envelope: Envelope) -> None:
        metrics = self.metrics
        if envelope.sent_at_ms is not None:
            delay = self.wall_clock() - envelope.sent_at_ms / 1000
            metrics.relay_latency.observe(max(0.0, delay), self.mode)
        if envelope.unit_index is not None:
            if envelope.unit_index == self.last_unit:
                return  # the Realtime API's newer dialect repeats a unit's facts per delta
            self.last_unit = envelope.unit_index
        if envelope.wall_clock_ms is not None:
            metrics.unit_latency.observe(envelope.wall_clock_ms / 1000, self.mode)
        if envelope.dropped_chunks:
            metrics.dropped_chunks.inc(self.mode, amount=envelope.dropped_chunks)
        if self.worker_id is not None and (envelope.wall_clock_ms or envelope.dropped_chunks):
            metrics.live.unit(self.worker_id, envelope.wall_clock_ms, envelope.dropped_chunks or 0)
        self._context(envelope)

    def _context(self, envelope: Envelope) -> None:
        if self.worker_id is None or self.session_id is None or envelope.kv_cache_length is None:
            return
        if self._shown_context not in (None, self.session_id):
            self.ended()  # a connection that runs sessions one after another shows its last
        self._shown_context = self.session_id
        context = SessionContext(
            worker_id=self.worker_id,
            kv_cache_length=envelope.kv_cache_length,
            context_capacity=envelope.context_capacity,
            evicted_units=envelope.evicted_units or 0,
            updated_at=self.wall_clock(),
        )
        self.metrics.live.context(self.session_id, context)


def session_observer(connection: WebSocket | ClientSocket) -> SessionObserver | None:
    """The observer of a session connection; None on other routes (and
    where the app runs without :class:`ObserveMiddleware`)."""
    observer = connection.scope.get("state", {}).get(OBSERVER_KEY)
    return observer if isinstance(observer, SessionObserver) else None


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
        metrics = self.metrics
        observer = SessionObserver(mode, metrics)
        # The server gives each connection its own copy of the state dict.
        scope.setdefault("state", {})[OBSERVER_KEY] = observer

        async def receiving() -> Message:
            message = await receive()
            if message["type"] == "websocket.receive":
                metrics.messages.inc(mode, "in")
                observer.received()
            return message

        async def sending(message: Message) -> None:
            kind = message["type"]
            if kind == "websocket.accept":
                metrics.sessions_opened.inc(mode)
            await send(message)
            if kind == "websocket.send" and message.get("text"):
                metrics.messages.inc(mode, "out")

        try:
            await self.app(scope, receiving, sending)
        finally:  # whichever way it ended: nothing of it stays on the admin page
            observer.ended()

    def _counting_http(self, send: Send) -> Send:
        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.http_responses.inc(str(message["status"]))
            await send(message)

        return sending

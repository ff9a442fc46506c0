"""OpenAI's Live API at the gateway, without I/O.

WAITING_START → QUEUED → ACTIVE → CLOSED. Nothing is queued until the
client's ``session.start`` names the model and the session (the Live API
puts the model there, not in the URL); any other event before it is a
``session_not_started`` error, and the session waits on. A start omnilive
cannot serve (:func:`~omnilive.protocol.openai_live.refusal`) is refused by
name, and the client may start again.

Once started, each client event is checked against its typed schema and
against what the gateway knows of the session (its delegation owner, its
appends' size, an update's delegation type) and passed to the worker, where
the session lives (``worker/live/runner.py``), which speaks the dialect
itself. While the session waits for a worker, the machine keeps what the
client sent (in order, bounded: the oldest audio goes first) and tells the
client where it stands in the Live union's own ``info`` event. Ends the
gateway decides (time limit, shutdown, a lost worker) are an ``error``
naming why, then ``session.closed``, then the socket closes.
"""

from __future__ import annotations

import time
from collections import deque
from enum import StrEnum
from typing import Any

from omnilive.gateway.realtime.machine import Action, Close, ToClient, ToWorker
from omnilive.protocol.common import ProtocolError, decode_event
from omnilive.protocol.openai_live import (
    DIALECT,
    MAX_APPEND_TOKENS,
    Append,
    ResponseCreate,
    ResponseItemCreate,
    SessionClose,
    SessionConfig,
    SessionStart,
    SessionUpdate,
    append_tokens,
    parse_client_event,
    refusal,
    update_refusal,
)
from omnilive.protocol.openai_live_events import (
    CloseReason as LiveCloseReason,
)
from omnilive.protocol.openai_live_events import (
    error_event,
    info_event,
    refusal_event,
    session_closed,
    session_resource,
)
from omnilive.protocol.realtime import CloseReason
from omnilive.transitions import IllegalTransition

MAX_HELD_EVENTS = 256  # besides the audio dropped oldest first, as the GA dialect's
CLOSE_NORMAL = 1000
CLOSE_SERVER_ERROR = 1011

# A server-side end: the error that says why, and session.closed's reason.
_ENDS: dict[CloseReason, tuple[str, str, LiveCloseReason]] = {
    CloseReason.TIMEOUT: ("session_expired", "the session reached its time limit", "expired"),
    CloseReason.SERVER_SHUTDOWN: (
        "server_shutdown", "the server is shutting down", "remote_hangup",
    ),
    CloseReason.CONTEXT_FULL: ("session_expired", "the model's context is full", "expired"),
    CloseReason.ERROR: ("server_error", "the session failed on its worker", "connection_lost"),
}  # fmt: skip


class LiveState(StrEnum):
    WAITING_START = "waiting_start"
    QUEUED = "queued"
    ACTIVE = "active"
    CLOSED = "closed"


class LiveMachine:
    """One Live connection's rules at the gateway."""

    dialect = DIALECT
    task_type = "audio_duplex"  # the pool's kind: a duplex unit loop
    worker_kind = "live"  # the worker's runner (worker/live/runner.py)

    def __init__(
        self, session_id: str, max_message_bytes: int, limit_s: float, clock: Any = time.time
    ) -> None:
        self.session_id = session_id
        self.max_message_bytes = max_message_bytes
        self.limit_s = limit_s
        self._clock = clock
        self.state = LiveState.WAITING_START
        self.config: SessionConfig | None = None
        self.expires_at = 0
        self.started_at = 0.0
        self._start_event_id: str | None = None
        self._waited = False
        self._held: deque[dict[str, Any]] = deque()
        self.dropped_appends = 0

    @property
    def started(self) -> bool:
        return self.config is not None

    def resource(self) -> dict[str, Any]:
        assert self.config is not None, "started first"
        return session_resource(self.session_id, self.config, self.expires_at)

    # --- the client --------------------------------------------------------------------

    def client_frame(self, raw: str | bytes) -> list[Action]:
        if self.state is LiveState.CLOSED:
            return []
        try:
            return self._event(decode_event(raw, self.max_message_bytes, parse_client_event))
        except ProtocolError as exc:  # the frame's, or a ProtocolError of the event's own
            return [ToClient(refusal_event(exc))]

    def _event(self, event: Any) -> list[Action]:
        if isinstance(event, SessionStart):
            return self._start(event)
        if self.config is None:
            message = "send session.start first and wait for session.started"
            raise ProtocolError("session_not_started", message, "type", event.event_id)
        if isinstance(event, SessionClose):
            return self._close(event)
        if isinstance(event, SessionUpdate):
            refused = update_refusal(self.config, event.session)
            if refused is not None:
                refused.event_id = event.event_id
                raise refused
            # The worker hears the whole session as it stands, so the two never differ.
            self.config = self.config.updated(event.session)
            update: dict[str, Any] = {
                "type": "session.update",
                "event_id": event.event_id,
                "session": self.config.model_dump(mode="json", exclude_none=True),
            }
            return self._to_worker(update)
        if isinstance(event, Append):
            self._check_append(event)
        if (
            isinstance(event, ResponseItemCreate | ResponseCreate)
            and self.config.owner != "responses"
        ):
            message = f"{event.type} needs a session whose delegation is responses"
            raise ProtocolError("responses_delegation_required", message, "type", event.event_id)
        return self._to_worker(event.model_dump(mode="json", exclude_none=True))

    def _start(self, event: SessionStart) -> list[Action]:
        if self.config is not None:
            message = "the session has started: session.start comes once"
            raise ProtocolError("session_already_started", message, "type", event.event_id)
        refused = refusal(event.session)
        if refused is not None:
            refused.event_id = event.event_id
            raise refused
        self.config = event.session
        self._start_event_id = event.event_id
        self.started_at = self._clock()
        self.expires_at = int(self.started_at + self.limit_s)
        self.state = LiveState.QUEUED
        return []

    def _check_append(self, event: Append) -> None:
        assert self.config is not None
        tokens = append_tokens(event.content)
        if tokens > MAX_APPEND_TOKENS:
            message = f"{tokens} tokens (4 bytes each) exceed {MAX_APPEND_TOKENS} in one append"
            raise ProtocolError("content_too_long", message, "content", event.event_id)
        if event.delegation_id is not None and self.config.owner == "responses":
            message = "a delegation id is for client delegations; this session's are responses"
            raise ProtocolError("invalid_value", message, "delegation_id", event.event_id)

    def _close(self, event: SessionClose) -> list[Action]:
        if self.state is LiveState.ACTIVE:  # the worker finishes it and says session.closed
            return [ToWorker(event.model_dump(mode="json", exclude_none=True))]
        return self._closed("close_requested", event.event_id)

    def _to_worker(self, message: dict[str, Any]) -> list[Action]:
        if self.state is LiveState.ACTIVE:
            return [ToWorker(message)]
        self._held.append(message)
        while len(self._held) > MAX_HELD_EVENTS:
            oldest_audio = next(
                (e for e in self._held if e["type"] == "session.input_audio.append"), None
            )
            if oldest_audio is None:
                refused = self._held.pop()  # the newest non-audio event is refused
                why = "too many events while the session waits for a worker"
                return [
                    ToClient(error_event("too_many_events", why, None, refused.get("event_id")))
                ]
            self._held.remove(oldest_audio)
            self.dropped_appends += 1
        return []

    # --- the queue ------------------------------------------------------------------

    def queue_event(self, message: dict[str, Any]) -> list[Action]:
        """Where the session stands, as ``info``; a session never queued hears nothing."""
        waiting = message["type"] != "queue_done"
        if not (waiting or self._waited):
            return []
        self._waited = True
        if not waiting:
            return [ToClient(info_event("queue_done", "a worker took the session"))]
        position = message.get("position", 0)
        wait_s = float(message.get("estimated_wait_s", 0.0))
        text = f"waiting for a worker: position {position}, about {wait_s:.0f} s"
        return [ToClient(info_event("queue_waiting", text))]

    def attach_worker(self) -> list[Action]:
        """The worker's session socket is open: it learns the session, then
        what else the client sent, in order (it answers ``session.started``)."""
        if self.state is not LiveState.QUEUED or self.config is None:
            raise IllegalTransition(f"{self.state} → active")
        self.state = LiveState.ACTIVE
        start = {
            "type": "internal.live",
            "session_id": self.session_id,
            "session": self.config.model_dump(mode="json", exclude_none=True),
            "expires_at": self.expires_at,
            "event_id": self._start_event_id,
            "dropped_appends": self.dropped_appends,
        }
        held, self._held = list(self._held), deque()
        return [ToWorker(start), *(ToWorker(event) for event in held)]

    # --- the worker -------------------------------------------------------------------

    def worker_closed(self) -> None:
        """The worker said ``session.closed``: the session is over."""
        self.state = LiveState.CLOSED

    # --- endings -------------------------------------------------------------------------

    def _closed(self, reason: LiveCloseReason, client_event_id: str | None) -> list[Action]:
        self.state = LiveState.CLOSED
        seconds = self._clock() - self.started_at
        closed = session_closed(self.resource(), reason, seconds, client_event_id)
        return [ToClient(closed), Close(CLOSE_NORMAL)]

    def end(self, reason: CloseReason) -> list[Action]:
        """A server-side end: an ``error`` that says why, ``session.closed``, the close."""
        if self.state is LiveState.CLOSED:
            return []
        if reason is CloseReason.STOPPED:
            if self.config is None:
                self.state = LiveState.CLOSED
                return [Close(CLOSE_NORMAL)]
            return self._closed("close_requested", None)
        code, message, why = _ENDS.get(
            reason, ("server_error", f"the session ended: {reason}", "connection_lost")
        )
        kind = "server_error" if reason is CloseReason.ERROR else "invalid_request_error"
        actions: list[Action] = [ToClient(error_event(code, message, kind=kind))]
        if self.config is None:
            self.state = LiveState.CLOSED
            return [*actions, Close(CLOSE_NORMAL)]
        *closed, _ = self._closed(why, None)
        failed = reason is CloseReason.ERROR
        return [*actions, *closed, Close(CLOSE_SERVER_ERROR if failed else CLOSE_NORMAL)]

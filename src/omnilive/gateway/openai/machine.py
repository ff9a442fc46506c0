"""The OpenAI Realtime API (GA) dialect at the gateway, without I/O.

QUEUED → ACTIVE → CLOSED. The machine checks each client event against its
typed schema (a bad one is an OpenAI-shaped ``error`` and the session goes
on), and passes the good ones to the worker, where the session lives
(``worker/openai/runner.py``). It owns no session logic: while the
session waits for a worker it keeps what the client sent (the configuration
merged into one ``session.update``, other events in order, bounded), and
tells the client where it stands in OpenAI's own ``rate_limits.updated``
(and, for a client that asked for ``omnilive_extensions``, omnilive's
``omnilive.queue.*`` with its position): by default only events of OpenAI's
server-event union are sent, which strict clients (the Python Agents SDK)
require.
"""

from __future__ import annotations

from collections import deque
from enum import StrEnum
from typing import Any

from omnilive.gateway.realtime.machine import Action, Close, ToClient, ToWorker
from omnilive.protocol.common import ProtocolError, decode_event
from omnilive.protocol.internal import Envelope
from omnilive.protocol.openai_realtime import (
    DIALECT,
    DUPLEX_SUFFIX,
    OMNILIVE_QUEUE_EVENTS,
    AudioAppend,
    SessionConfig,
    SessionUpdate,
    error_event,
    parse_client_event,
    queue_rate_limits,
    refusal_event,
    server_event,
    session_object,
)
from omnilive.protocol.realtime import CloseReason
from omnilive.transitions import IllegalTransition

# Events kept while queued besides the configuration; audio beyond this is
# dropped oldest first (and counted), since a client streams its microphone
# from the start.
MAX_HELD_EVENTS = 256
CLOSE_SERVER_ERROR = 1011
CLOSE_NORMAL = 1000

_END_CODES = {
    CloseReason.TIMEOUT: ("session_expired", "the session reached its time limit"),
    CloseReason.SERVER_SHUTDOWN: ("server_shutdown", "the server is shutting down"),
    CloseReason.CONTEXT_FULL: ("context_full", "the model's context is full"),
    CloseReason.ERROR: ("server_error", "the session failed on its worker"),
}


class OpenAIState(StrEnum):
    QUEUED = "queued"
    ACTIVE = "active"
    CLOSED = "closed"


class OpenAIRealtimeMachine:
    """One GA-dialect connection's rules at the gateway."""

    dialect = DIALECT

    def __init__(
        self, session_id: str, model: str, max_message_bytes: int, extensions: bool = False
    ) -> None:
        self.session_id = session_id
        self.model = model
        self.extensions = extensions  # omnilive's own events too (EXTENSIONS_PARAM)
        self._waited = False  # the session was queued: its end of waiting is told
        # omnilive's extension: a model named ``*-duplex`` runs the session on
        # the full-duplex unit loop (the model decides when to speak); any
        # other on the half-duplex path (turn detection decides).
        self.duplex = model.endswith(DUPLEX_SUFFIX)
        self.task_type = "audio_duplex" if self.duplex else "half_duplex"
        self.worker_kind = "openai_duplex" if self.duplex else "conversation"
        self.max_message_bytes = max_message_bytes
        self.state = OpenAIState.QUEUED
        self.config = SessionConfig()
        self._config_changed = False
        self._held: deque[dict[str, Any]] = deque()
        self.dropped_appends = 0

    def created(self) -> list[Action]:
        """What the client hears on connecting: its session, as OpenAI's server says it."""
        session = session_object(self.session_id, self.config, self.model)
        return [ToClient(server_event("session.created", session=session))]

    # --- the queue ------------------------------------------------------------------

    def queue_event(self, message: dict[str, Any]) -> list[Action]:
        """Where the session stands in the queue; a session never queued
        hears nothing of it (the pool says ``queue_done`` to every one)."""
        waiting = message["type"] != "queue_done"
        if not (waiting or self._waited):
            return []
        self._waited = True
        actions: list[Action] = [ToClient(queue_rate_limits(message))]
        if self.extensions:
            kind = OMNILIVE_QUEUE_EVENTS[message["type"]]
            fields = {k: v for k, v in message.items() if k != "type"}
            actions.append(ToClient(server_event(kind, **fields)))
        return actions

    def attach_worker(self) -> list[Action]:
        """The worker's session socket is open: it learns the session as
        configured so far (it answers ``session.updated`` if the client sent
        an update meanwhile), then what else the client sent, in order."""
        if self.state is not OpenAIState.QUEUED:
            raise IllegalTransition(f"{self.state} → active")
        self.state = OpenAIState.ACTIVE
        update = next((e for e in self._held if e["type"] == "session.update"), None)
        start = {
            "type": "internal.openai",
            "session_id": self.session_id,
            "model": self.model,
            "session": self.config.model_dump(mode="json"),
            "updated": update is not None,
            "event_id": update.get("event_id") if update is not None else None,
            "dropped_appends": self.dropped_appends,
            "extensions": self.extensions,
        }
        held = [e for e in self._held if e["type"] != "session.update"]
        self._held = deque()
        return [ToWorker(start), *(ToWorker(event) for event in held)]

    # --- the client --------------------------------------------------------------------

    def client_frame(self, raw: str | bytes) -> list[Action]:
        if self.state is OpenAIState.CLOSED:
            return []
        try:
            event = decode_event(raw, self.max_message_bytes, parse_client_event)
        except ProtocolError as exc:
            return [ToClient(refusal_event(exc))]
        if isinstance(event, SessionUpdate):
            # The worker hears the whole session as it stands, so the two never differ.
            self.config = self.config.updated(event.session)
            message = {
                "type": "session.update",
                "event_id": event.event_id,
                "session": self.config.model_dump(mode="json"),
            }
        else:
            message = event.model_dump(mode="json", exclude_none=True)
        return self._to_worker(message, isinstance(event, AudioAppend))

    def _to_worker(self, message: dict[str, Any], is_audio: bool) -> list[Action]:
        if self.state is OpenAIState.ACTIVE:
            return [ToWorker(message)]
        if message["type"] == "session.update":
            self._held = deque(e for e in self._held if e["type"] != "session.update")
        self._held.append(message)
        while len(self._held) > MAX_HELD_EVENTS:
            oldest_audio = next(
                (e for e in self._held if e["type"] == "input_audio_buffer.append"), None
            )
            if oldest_audio is None:
                self._held.pop()  # the newest non-audio event is refused
                return [ToClient(error_event("too_many_events", "too many events while queued"))]
            self._held.remove(oldest_audio)
            self.dropped_appends += 1
        return []

    # --- the worker --------------------------------------------------------------------

    @staticmethod
    def forwards(event_type: str) -> bool:
        """Every worker event goes to the client as it is (the worker speaks the dialect)."""
        return True

    def worker_event(self, envelope: Envelope) -> list[Action]:
        return []

    # --- endings ---------------------------------------------------------------------------

    def end(self, reason: CloseReason) -> list[Action]:
        """A server-side end: an ``error`` that says why, then the socket closes."""
        if self.state is OpenAIState.CLOSED:
            return []
        self.state = OpenAIState.CLOSED
        if reason is CloseReason.STOPPED:
            return [Close(CLOSE_NORMAL)]
        code, message = _END_CODES.get(reason, ("server_error", f"the session ended: {reason}"))
        kind = "server_error" if reason is CloseReason.ERROR else "invalid_request_error"
        failed = reason is CloseReason.ERROR
        return [
            ToClient(error_event(code, message, kind=kind)),
            Close(CLOSE_SERVER_ERROR if failed else CLOSE_NORMAL),
        ]

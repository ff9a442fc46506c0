"""The client side of a session, as a state machine without I/O.

CONNECTING → WAITING → CONFIGURING → ACTIVE → CLOSING → CLOSED. Feed it what
the server sent and what the user asks; it answers with actions (send this,
hand the user that event, the session is ready, close the socket) and, once
the socket has closed, with how the session ended: normally, or as the
typed exception of the error that ended it. Every mode follows these rules;
a :class:`ModeRules` says what its configuring, ready, ending and stopping
messages are. Sessions (``session.py``) only carry the actions out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from omnilive.client.errors import (
    ConnectionLostError,
    NotReadyError,
    OmniliveError,
    ProtocolViolationError,
    SessionClosedError,
)
from omnilive.client.events import (
    Event,
    Queued,
    QueueDone,
    QueueUpdate,
    ServerError,
    SessionResumed,
    UnknownEvent,
    parse_event,
)


class SessionState(StrEnum):
    CONNECTING = "connecting"  # the socket is not open yet
    WAITING = "waiting"  # open, in the queue (or about to hear queue_done)
    CONFIGURING = "configuring"  # the configuring message went out (prepare, session.init, ...)
    ACTIVE = "active"  # ready: prepared, created, or (chat) generating
    CLOSING = "closing"  # the client asked to end
    CLOSED = "closed"


@dataclass(frozen=True)
class Send:
    message: Mapping[str, Any]


@dataclass(frozen=True)
class Deliver:
    event: Event


@dataclass(frozen=True)
class Ready:
    """The session reached ACTIVE with this event."""

    event: Event


@dataclass(frozen=True)
class CloseSocket:
    pass


Action = Send | Deliver | Ready | CloseSocket


@dataclass(frozen=True)
class ModeRules:
    """What makes one mode's session: the messages that configure, ready, end and stop it."""

    ready: tuple[type[Event], ...]
    ends: tuple[type[Event], ...]
    # The stop message; None closes the socket instead (chat has none).
    stop: Mapping[str, Any] | None
    # Chat sends its request at once; the others configure on queue_done.
    configure_on_open: bool = False
    # The Realtime API takes ``session.close`` while queued; the others do not.
    stop_while_waiting: bool = False
    # The exception an ending event stands for (a Realtime close for an error).
    failure: Callable[[Event], OmniliveError | None] = lambda event: None


@dataclass
class QueueStatus:
    """The latest the server said about this session's place in the queue."""

    position: int | None = None
    estimated_wait_s: float | None = None
    queue_length: int | None = None
    done: bool = False


_QUEUE_EVENTS = (Queued, QueueUpdate, QueueDone)
_ANY_TIME = (ServerError, UnknownEvent, SessionResumed)


@dataclass
class ClientMachine:
    rules: ModeRules
    configure: Mapping[str, Any] | None
    state: SessionState = SessionState.CONNECTING
    queue: QueueStatus = field(default_factory=QueueStatus)
    ending: Event | None = None  # the event that ended the session, if one did
    outcome: OmniliveError | None = None  # how it failed, once CLOSED
    _last_error: ServerError | None = None

    def _move(self, expected: tuple[SessionState, ...], target: SessionState) -> None:
        if self.state not in expected:
            raise ProtocolViolationError(f"{self.state} → {target}")
        self.state = target

    # --- the socket ----------------------------------------------------------------

    def opened(self) -> list[Action]:
        self._move((SessionState.CONNECTING,), SessionState.WAITING)
        if self.rules.configure_on_open:
            return self._configure()
        return []

    def closed(self, code: int | None, reason: str = "") -> OmniliveError | None:
        """The socket is closed: how the session ended (None: normally)."""
        before, self.state = self.state, SessionState.CLOSED
        if self.ending is not None or self.outcome is not None:
            return self.outcome
        if self._last_error is not None:  # the error that ended it came just before
            self.outcome = self._last_error.exception()
            self.outcome.details["close_code"] = code
        elif before is not SessionState.CLOSING:
            why = f"close code {code}" + (f": {reason}" if reason else "")
            self.outcome = ConnectionLostError(f"the server closed the session ({why})")
        return self.outcome

    def failed(self, error: OmniliveError) -> list[Action]:
        """The client cannot go on (e.g. the server broke the protocol)."""
        if self.outcome is None and self.ending is None:
            self.outcome = error
        if self.state is not SessionState.CLOSED:
            self.state = SessionState.CLOSING
        return [CloseSocket()]

    # --- the server --------------------------------------------------------------------

    def received(self, data: Mapping[str, Any]) -> list[Action]:
        event = parse_event(data)
        if self.state is SessionState.CLOSED:
            return []
        prior_error = self._last_error
        self._last_error = event if isinstance(event, ServerError) else None
        actions: list[Action] = [Deliver(event)]
        if isinstance(event, self.rules.ends):
            self.ending = event
            failure = self.rules.failure(event)
            if failure is not None and prior_error is not None:
                failure = prior_error.exception()  # the error just before names the cause
            self.outcome = failure
            self.state = SessionState.CLOSING
            return actions
        if isinstance(event, _ANY_TIME):
            return actions
        if isinstance(event, _QUEUE_EVENTS):
            return actions + self._queue_event(event)
        if self.state is SessionState.CLOSING:
            return actions  # the server answers what was sent before the stop
        if isinstance(event, self.rules.ready):
            self._move((SessionState.CONFIGURING,), SessionState.ACTIVE)
            return [*actions, Ready(event)]
        if self.state is not SessionState.ACTIVE:
            raise ProtocolViolationError(f"{type(event).__name__} while {self.state}")
        return actions

    def _queue_event(self, event: Event) -> list[Action]:
        if self.state not in (SessionState.WAITING, SessionState.CONFIGURING):
            if self.state is SessionState.CLOSING:
                return []
            raise ProtocolViolationError(f"{type(event).__name__} while {self.state}")
        queue = self.queue
        if isinstance(event, QueueDone):
            queue.done, queue.position, queue.estimated_wait_s = True, 0, 0.0
            if self.state is SessionState.WAITING:
                return self._configure()
            return []
        assert isinstance(event, Queued | QueueUpdate)
        queue.position = event.position if event.position is not None else queue.position
        if event.estimated_wait_s is not None:
            queue.estimated_wait_s = event.estimated_wait_s
        if event.queue_length is not None:
            queue.queue_length = event.queue_length
        return []

    def _configure(self) -> list[Action]:
        self._move((SessionState.WAITING,), SessionState.CONFIGURING)
        return [Send(self.configure)] if self.configure is not None else []

    # --- the user ------------------------------------------------------------------------

    def check_sendable(self) -> None:
        """Raise unless the user may send data now: how the session failed, if it did."""
        if self.outcome is not None:
            raise self.outcome
        if self.state in (SessionState.CLOSING, SessionState.CLOSED):
            raise SessionClosedError("the session has ended")
        if self.state is not SessionState.ACTIVE:
            raise NotReadyError(f"the session is not ready yet ({self.state})")

    def stop(self) -> list[Action]:
        """End the session the protocol's way (the server answers and closes)."""
        if self.state in (SessionState.CLOSING, SessionState.CLOSED):
            return []
        waiting = self.state in (SessionState.CONNECTING, SessionState.WAITING)
        self.state = SessionState.CLOSING
        if self.rules.stop is None or (waiting and not self.rules.stop_while_waiting):
            return [CloseSocket()]
        return [Send(self.rules.stop)]

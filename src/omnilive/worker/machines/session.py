"""What every streaming session's rules share, without I/O: a prepare that
may be in flight while the client goes on (control first, data held until
it is done), one way to end, and a deadline the runner's clock checks."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from omnilive.protocol.common import ErrorCode, ProtocolError
from omnilive.transitions import IllegalTransition

# Messages kept while a prepare is in flight; beyond it the oldest is dropped.
MAX_HELD = 32


class Phase(StrEnum):
    WAITING_PREPARE = "waiting_prepare"
    PREPARING = "preparing"
    ACTIVE = "active"  # duplex: the unit loop runs; half-duplex: listening
    PAUSED = "paused"  # duplex only
    ANSWERING = "answering"  # half-duplex only
    ENDED = "ended"


@dataclass(frozen=True)
class Ended:
    """Why the session is over (``detail``: the reason a client gave to stop)."""

    reason: str  # stopped | idle | timeout | pause | context_full | disconnected
    tell_client: bool = True
    detail: str | None = None


class SessionMachine:
    def __init__(self, first_message_s: float, now: float) -> None:
        self.first_message_s = first_message_s
        self.phase = Phase.WAITING_PREPARE
        self.started = now
        self.ended: Ended | None = None
        self.held: deque[Any] = deque()

    # --- prepare ---------------------------------------------------------------------

    def prepare(self) -> None:
        if self.phase is not Phase.WAITING_PREPARE:
            raise ProtocolError(ErrorCode.INVALID_REQUEST, "session is already prepared")
        self.phase = Phase.PREPARING

    def hold(self, message: Any) -> bool:
        """Keep a message that came during a prepare, for when it is done.
        Returns False when the session is not preparing (handle it now)."""
        if self.phase is not Phase.PREPARING:
            return False
        if len(self.held) >= MAX_HELD:
            self.held.popleft()
        self.held.append(message)
        return True

    def prepared(self, now: float) -> list[Any]:
        """The prepare succeeded; returns the messages held meanwhile, in order."""
        if self.phase is Phase.ENDED:  # stopped while it was being prepared
            return []
        self.expect(Phase.PREPARING, "prepared")
        self.phase = Phase.ACTIVE
        self.started = now
        return self._release_held()

    def prepare_failed(self) -> list[Any]:
        """The prepare failed: the client may send another. Messages held for
        the session it would have had are given back (they get their errors)."""
        if self.phase is Phase.ENDED:
            return []
        self.expect(Phase.PREPARING, "prepare failed")
        self.phase = Phase.WAITING_PREPARE
        return self._release_held()

    def _release_held(self) -> list[Any]:
        held, self.held = list(self.held), deque()
        return held

    def require_prepared(self, what: str) -> None:
        if self.phase in (Phase.WAITING_PREPARE, Phase.PREPARING):
            raise ProtocolError(ErrorCode.NOT_READY, f"send prepare before {what}")

    # --- endings and time --------------------------------------------------------------

    def stop(self, detail: str | None = None) -> Ended:
        return self.end(Ended("stopped", detail=detail))

    def disconnected(self) -> Ended:
        return self.end(Ended("disconnected", tell_client=False))

    def end(self, ended: Ended) -> Ended:
        """The first ending wins; later ones are the same session's."""
        if self.ended is None:
            self.ended = ended
            self.phase = Phase.ENDED
        return self.ended

    def deadline(self) -> tuple[float, str]:
        """When the session ends unless something happens first, and why."""
        return self.started + self.first_message_s, "idle"

    def tick(self, now: float) -> Ended | None:
        at, reason = self.deadline()
        return self.end(Ended(reason)) if now >= at else None

    def expect(self, phase: Phase, event: str) -> None:
        if self.phase is not phase:
            raise IllegalTransition(f"{event} in {self.phase}")

"""What every streaming session's rules share, without I/O: a prepare that
may be in flight while the client goes on (control first, data held until
it is done), one way to end, and a deadline the runner's clock checks.

Each mode has its own phase enum (``DuplexPhase``, ``HalfDuplexPhase``):
what they share is named once, in the mode's :class:`Phases`."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Generic, TypeVar

from omnilive.protocol.common import ErrorCode, ProtocolError
from omnilive.transitions import IllegalTransition

# Messages kept while a prepare is in flight; beyond it the oldest is dropped.
MAX_HELD = 32


P = TypeVar("P", bound=StrEnum)


@dataclass(frozen=True)
class Phases(Generic[P]):
    """The members of a mode's phase enum that every streaming session goes
    through: waiting for its prepare, being prepared, prepared (the phase a
    prepared session starts in) and ended."""

    waiting_prepare: P
    preparing: P
    prepared: P
    ended: P


@dataclass(frozen=True)
class Ended:
    """Why the session is over (``detail``: the reason a client gave to stop)."""

    reason: str  # stopped | idle | timeout | pause | context_full | disconnected
    tell_client: bool = True
    detail: str | None = None


class SessionMachine(Generic[P]):
    """The prepare, the endings and the first deadline, over the phases of
    the mode's own enum (``phases``, set by each mode's machine)."""

    phases: Phases[P]

    def __init__(self, first_message_s: float, now: float) -> None:
        self.first_message_s = first_message_s
        self.phase: P = self.phases.waiting_prepare
        self.started = now
        self.ended: Ended | None = None
        self.held: deque[Any] = deque()

    # --- prepare ---------------------------------------------------------------------

    def prepare(self) -> None:
        if self.phase is not self.phases.waiting_prepare:
            raise ProtocolError(ErrorCode.INVALID_REQUEST, "session is already prepared")
        self.phase = self.phases.preparing

    def hold(self, message: Any) -> bool:
        """Keep a message that came during a prepare, for when it is done.
        Returns False when the session is not preparing (handle it now)."""
        if self.phase is not self.phases.preparing:
            return False
        if len(self.held) >= MAX_HELD:
            self.held.popleft()
        self.held.append(message)
        return True

    def prepared(self, now: float) -> list[Any]:
        """The prepare succeeded; returns the messages held meanwhile, in order."""
        if self.phase is self.phases.ended:  # stopped while it was being prepared
            return []
        self.expect(self.phases.preparing, "prepared")
        self.phase = self.phases.prepared
        self.started = now
        return self._release_held()

    def prepare_failed(self) -> list[Any]:
        """The prepare failed: the client may send another. Messages held for
        the session it would have had are given back (they get their errors)."""
        if self.phase is self.phases.ended:
            return []
        self.expect(self.phases.preparing, "prepare failed")
        self.phase = self.phases.waiting_prepare
        return self._release_held()

    def _release_held(self) -> list[Any]:
        held, self.held = list(self.held), deque()
        return held

    @property
    def unprepared(self) -> bool:
        """Waiting for a prepare, or being prepared."""
        return self.phase in (self.phases.waiting_prepare, self.phases.preparing)

    def require_prepared(self, what: str) -> None:
        if self.unprepared:
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
            self.phase = self.phases.ended
        return self.ended

    def deadline(self) -> tuple[float, str]:
        """When the session ends unless something happens first, and why."""
        return self.started + self.first_message_s, "idle"

    def tick(self, now: float) -> Ended | None:
        at, reason = self.deadline()
        return self.end(Ended(reason)) if now >= at else None

    def expect(self, phase: P, event: str) -> None:
        if self.phase is not phase:
            raise IllegalTransition(f"{event} in {self.phase}")

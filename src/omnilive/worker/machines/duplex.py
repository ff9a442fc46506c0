"""The rules of one full-duplex session on the worker, without I/O.

WAITING_PREPARE → PREPARING → ACTIVE ⇄ PAUSED → ENDED. The runner
(``worker/runners/duplex.py``) feeds it what happens (a client message, a
step that finished, the clock) and does what it answers. Control is never
behind data: ``stop`` ends the session in every phase, a ``prepare`` in
flight included, and messages that arrive while the session is being
prepared wait for it (:meth:`DuplexMachine.hold`) instead of being refused.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from omnilive.protocol.common import ErrorCode, ProtocolError

# Messages kept while a prepare is in flight; beyond it the oldest is dropped.
MAX_HELD = 32


class Phase(StrEnum):
    WAITING_PREPARE = "waiting_prepare"
    PREPARING = "preparing"
    ACTIVE = "active"
    PAUSED = "paused"
    ENDED = "ended"


class IllegalTransition(Exception):
    """A step reported something its phase cannot follow (a bug, not a client error)."""


@dataclass(frozen=True)
class Limits:
    first_message_s: float  # from the worker's hand-over to a prepared session
    idle_s: float  # without audio, once prepared
    pause_s: float  # a pause's default length
    max_pause_s: float


@dataclass(frozen=True)
class Ended:
    """Why the session is over (``detail``: the reason a client gave to stop)."""

    reason: str  # stopped | idle | pause | context_full | disconnected
    tell_client: bool = True
    detail: str | None = None


class DuplexMachine:
    def __init__(self, limits: Limits, now: float) -> None:
        self.limits = limits
        self.phase = Phase.WAITING_PREPARE
        self.started = now
        self.last_audio = now
        self.pause_deadline: float | None = None
        self.context_limit: int | None = None
        self.ended: Ended | None = None
        self.held: deque[Any] = deque()

    # --- the client ----------------------------------------------------------------

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

    def audio(self, now: float) -> bool:
        """A chunk came: whether the model hears it (a paused session does not)."""
        self.require_prepared("audio_chunk")
        self.last_audio = now
        return self.phase is Phase.ACTIVE

    def pause(self, timeout: float | None, now: float) -> float:
        """Pause; returns its length (the default if none is asked, capped)."""
        self.require_prepared("pause")
        seconds = min(timeout or self.limits.pause_s, self.limits.max_pause_s)
        self.phase = Phase.PAUSED
        self.pause_deadline = now + seconds
        return seconds

    def resume(self, now: float) -> None:
        if self.phase is not Phase.PAUSED:
            raise ProtocolError(ErrorCode.INVALID_REQUEST, "session is not paused")
        self.phase = Phase.ACTIVE
        self.pause_deadline = None
        self.last_audio = now

    def update(self) -> None:
        self.require_prepared("update")

    def stop(self, detail: str | None = None) -> Ended:
        return self.end(Ended("stopped", detail=detail))

    def disconnected(self) -> Ended:
        return self.end(Ended("disconnected", tell_client=False))

    def require_prepared(self, what: str) -> None:
        if self.phase in (Phase.WAITING_PREPARE, Phase.PREPARING):
            raise ProtocolError(ErrorCode.NOT_READY, f"send prepare before {what}")

    # --- the engine -------------------------------------------------------------------

    def prepared(self, now: float) -> list[Any]:
        """The prepare succeeded; returns the messages held meanwhile, in order."""
        if self.phase is Phase.ENDED:  # stopped while it was being prepared
            return []
        self._expect(Phase.PREPARING, "prepared")
        self.phase = Phase.ACTIVE
        self.started = self.last_audio = now
        held, self.held = list(self.held), deque()
        return held

    def prepare_failed(self) -> list[Any]:
        """The prepare failed: the client may send another. Messages held for
        the session it would have had are given back (they get their errors)."""
        if self.phase is Phase.ENDED:
            return []
        self._expect(Phase.PREPARING, "prepare failed")
        self.phase = Phase.WAITING_PREPARE
        held, self.held = list(self.held), deque()
        return held

    def unit_done(self, kv_cache_length: int) -> Ended | None:
        """A unit's result went out: the session ends if the context is full."""
        if self.context_limit is not None and kv_cache_length >= self.context_limit:
            return self.end(Ended("context_full"))
        return None

    # --- time ---------------------------------------------------------------------------

    def deadline(self) -> tuple[float, str]:
        """When the session ends unless something happens first, and why."""
        if self.phase is Phase.PAUSED and self.pause_deadline is not None:
            return self.pause_deadline, "pause"
        if self.phase in (Phase.WAITING_PREPARE, Phase.PREPARING):
            return self.started + self.limits.first_message_s, "idle"
        return self.last_audio + self.limits.idle_s, "idle"

    def tick(self, now: float) -> Ended | None:
        at, reason = self.deadline()
        return self.end(Ended(reason)) if now >= at else None

    # --- endings ---------------------------------------------------------------------------

    def end(self, ended: Ended) -> Ended:
        """The first ending wins; later ones are the same session's."""
        if self.ended is None:
            self.ended = ended
            self.phase = Phase.ENDED
        return self.ended

    def _expect(self, phase: Phase, event: str) -> None:
        if self.phase is not phase:
            raise IllegalTransition(f"{event} in {self.phase}")

"""The rules of one full-duplex session on the worker, without I/O.

WAITING_PREPARE → PREPARING → ACTIVE ⇄ PAUSED → ENDED. The runner
(``worker/runners/duplex.py``) feeds it what happens (a client message, a
step that finished, the clock) and does what it answers. Control is never
behind data: ``stop`` ends the session in every phase, a ``prepare`` in
flight included, and messages that arrive while the session is being
prepared wait for it (``hold``) instead of being refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from omnilive.protocol.common import ErrorCode, ProtocolError
from omnilive.worker.machines.session import Ended, Phase, SessionMachine


@dataclass(frozen=True)
class Limits:
    first_message_s: float  # from the worker's hand-over to a prepared session
    idle_s: float  # without audio, once prepared
    pause_s: float  # a pause's default length
    max_pause_s: float


class DuplexMachine(SessionMachine):
    def __init__(self, limits: Limits, now: float) -> None:
        super().__init__(limits.first_message_s, now)
        self.limits = limits
        self.last_audio = now
        self.pause_deadline: float | None = None
        self.context_limit: int | None = None

    def prepared(self, now: float) -> list:
        held = super().prepared(now)
        self.last_audio = now
        return held

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

    def unit_done(self, kv_cache_length: int) -> Ended | None:
        """A unit's result went out: the session ends if the context is full."""
        if self.context_limit is not None and kv_cache_length >= self.context_limit:
            return self.end(Ended("context_full"))
        return None

    def deadline(self) -> tuple[float, str]:
        if self.phase is Phase.PAUSED and self.pause_deadline is not None:
            return self.pause_deadline, "pause"
        if self.phase in (Phase.WAITING_PREPARE, Phase.PREPARING):
            return super().deadline()
        return self.last_audio + self.limits.idle_s, "idle"

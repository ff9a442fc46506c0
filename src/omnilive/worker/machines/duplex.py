"""The rules of one full-duplex session on the worker, without I/O.

WAITING_PREPARE → PREPARING → ACTIVE ⇄ PAUSED → ENDED. The runner
(``worker/runners/duplex.py``) feeds it what happens (a client message, a
step that finished, the clock) and does what it answers. Control is never
behind data: ``stop`` ends the session in every phase, a ``prepare`` in
flight included, and messages that arrive while the session is being
prepared wait for it (``hold``) instead of being refused.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from omnilive.engines.messages import ContextWindow, WindowMode
from omnilive.protocol.common import ContextWindowOption, ErrorCode, ProtocolError
from omnilive.worker.machines.session import Ended, Phase, SessionMachine

MAX_FAILED_UNITS = 3  # failed units in a row that end a session


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
        self.largest_unit = 0  # positions the largest unit so far added
        self._last_length = 0
        self.failed_units = 0  # in a row

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

    def unit_done(self, kv_cache_length: int, capacity: int | None = None) -> Ended | None:
        """A unit's result went out: the session ends ``context_full`` when
        its context is at its limit (the Realtime API's), or when the
        context cannot take two more units of the largest kind seen so far
        (a fixed context, or a window the next unit would outgrow: never a
        unit that fails, and fails again)."""
        if self._last_length:  # the first unit's growth counts the system prompt too
            self.largest_unit = max(self.largest_unit, kv_cache_length - self._last_length)
        self._last_length = kv_cache_length
        if self.context_limit is not None and kv_cache_length >= self.context_limit:
            return self.end(Ended("context_full"))
        if capacity is not None and kv_cache_length + 2 * self.largest_unit > capacity:
            return self.end(Ended("context_full"))
        return None

    def unit_failed(self) -> bool:
        """A unit failed: whether the session goes on (it ends after
        ``MAX_FAILED_UNITS`` in a row: an engine that keeps failing would
        fail every second until the client left)."""
        self.failed_units += 1
        return self.failed_units < MAX_FAILED_UNITS

    def unit_succeeded(self) -> None:
        self.failed_units = 0

    def deadline(self) -> tuple[float, str]:
        if self.phase is Phase.PAUSED and self.pause_deadline is not None:
            return self.pause_deadline, "pause"
        if self.phase in (Phase.WAITING_PREPARE, Phase.PREPARING):
            return super().deadline()
        return self.last_audio + self.limits.idle_s, "idle"


def window_for(
    default: ContextWindow | None, given: ContextWindowOption | None
) -> ContextWindow | None:
    """The sliding context a session asked for: the fields it names over the
    engine's default (None: the engine's, or none where it has no window);
    an impossible one is the client's error."""
    if given is None:
        return default
    fields = given.model_dump(exclude_none=True)
    if "mode" in fields:
        fields["mode"] = WindowMode(fields["mode"])
    window = dataclasses.replace(default or ContextWindow(), **fields)
    if window.mode is WindowMode.BASIC and window.low_tokens >= window.high_tokens:
        raise ProtocolError(
            ErrorCode.INVALID_REQUEST, "context_window: low_tokens must be below high_tokens"
        )
    return window

"""The rules of one full-duplex session on the worker, without I/O.

WAITING_PREPARE → PREPARING → ACTIVE ⇄ PAUSED → ENDED. The runner
(``worker/runners/duplex.py``) feeds it what happens (a client message, a
step that finished, the clock) and does what it answers. Control is never
behind data: ``stop`` ends the session in every phase, a ``prepare`` in
flight included, and messages that arrive while the session is being
prepared wait for it (``hold``) instead of being refused.

The unit loop is the machine's too (:meth:`DuplexMachine.handle`): for each
chunk the buffer hands out it answers the steps to run — the dialect's
appends, then the unit (:meth:`DuplexSession.unit`: its prefill, then its
generate) — and, once the unit's result is in, what
to do with it, in order: present it, record it, finalize it (before the
result is sent unless the session defers it), send it, and end the session
when its context is full. A deferred finalize runs beside the loop, and the
next unit's prefill waits for it (:class:`AwaitFinalize`): the client hears
sooner and the model's state stays consistent. A unit that fails is skipped
(the client told), until ``MAX_FAILED_UNITS`` in a row end the session.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum

from omnilive.engines.base import EngineError
from omnilive.engines.messages import (
    ContextWindow,
    DuplexUnit,
    PrefillStats,
    UnitInput,
    WindowMode,
)
from omnilive.protocol.common import ContextWindowOption, ErrorCode, ProtocolError
from omnilive.recording.duplex import UnitMode
from omnilive.transitions import IllegalTransition
from omnilive.worker.chunk_buffer import PendingChunk
from omnilive.worker.machines.session import Ended, Phases, SessionMachine
from omnilive.worker.presenters import UnitTiming

MAX_FAILED_UNITS = 3  # failed units in a row that end a session


class DuplexPhase(StrEnum):
    WAITING_PREPARE = "waiting_prepare"
    PREPARING = "preparing"
    ACTIVE = "active"  # the unit loop runs
    PAUSED = "paused"  # the model hears nothing until resume
    ENDED = "ended"


DUPLEX_PHASES = Phases(
    DuplexPhase.WAITING_PREPARE, DuplexPhase.PREPARING, DuplexPhase.ACTIVE, DuplexPhase.ENDED
)


@dataclass(frozen=True)
class Limits:
    first_message_s: float  # from the worker's hand-over to a prepared session
    idle_s: float  # without audio, once prepared
    pause_s: float  # a pause's default length
    max_pause_s: float


# --- the unit loop's events (times: the runner's perf_counter seconds) ----------------


@dataclass(frozen=True, eq=False)
class ChunkReady:
    """The buffer handed the loop its next chunk."""

    chunk: PendingChunk


@dataclass(frozen=True, eq=False)
class UnitRan:
    """The unit (begun at ``started``) is done; the stats' ``cost_ms`` is
    its prefill's part; ``dropped_total``: the chunks the buffer has
    dropped so far."""

    stats: PrefillStats
    unit: DuplexUnit
    started: float
    now: float
    dropped_total: int


@dataclass(frozen=True, eq=False)
class UnitFailed:
    """A step of the unit failed (``EngineError``)."""

    error: EngineError


@dataclass(frozen=True)
class Finalized:
    """The unit's finalize ran (``error``: why it failed, if it did)."""

    error: str | None = None


UnitEvent = ChunkReady | UnitRan | UnitFailed | Finalized

# --- the unit loop's actions ---------------------------------------------------------


@dataclass(frozen=True)
class AwaitFinalize:
    """Wait until the finalize in flight has run (it reports :class:`Finalized`)."""


@dataclass(frozen=True)
class BetweenUnits:
    """Write what the dialect has for the context between two units (the
    Live API's appends)."""


@dataclass(frozen=True, eq=False)
class RunUnit:
    """Run the unit as one step (:meth:`DuplexSession.unit`); report :class:`UnitRan`."""

    given: UnitInput


@dataclass(frozen=True, eq=False)
class Present:
    """Write the unit's result in the dialect's messages now (their times
    are the result's), to be sent at :class:`SendPresented`."""

    unit: DuplexUnit
    chunk: PendingChunk
    timing: UnitTiming


@dataclass(frozen=True, eq=False)
class RecordUnit:
    """Add the unit to the session's recording (where it is recorded)."""

    chunk: PendingChunk
    unit: DuplexUnit
    mode: UnitMode
    timing: dict[str, float]


@dataclass(frozen=True)
class Finalize:
    """Run the unit's finalize, beside the loop where ``deferred`` (else
    now); report :class:`Finalized`."""

    deferred: bool


@dataclass(frozen=True)
class SendPresented:
    """Send what :class:`Present` wrote."""


@dataclass(frozen=True)
class ReportError:
    code: ErrorCode
    message: str


@dataclass(frozen=True)
class SkipUnit:
    """The unit failed and is dropped; the session goes on (the client is told)."""

    index: int
    error: EngineError

    @property
    def message(self) -> str:
        return f"unit failed: {self.error}"


@dataclass(frozen=True)
class GiveUp:
    """Units keep failing: the session ends with this error (raised, logged once)."""

    error: EngineError


@dataclass(frozen=True)
class End:
    """The session is over (``ended`` says why): the loop stops."""

    ended: Ended


UnitAction = (
    AwaitFinalize
    | BetweenUnits
    | RunUnit
    | Present
    | RecordUnit
    | Finalize
    | SendPresented
    | ReportError
    | SkipUnit
    | GiveUp
    | End
)


@dataclass
class _InFlight:
    """The unit being computed."""

    chunk: PendingChunk
    started: float = 0.0
    prefilled: float = 0.0


class DuplexMachine(SessionMachine[DuplexPhase]):
    """One duplex session: its phases and deadlines, and its unit loop."""

    phases = DUPLEX_PHASES

    def __init__(self, limits: Limits, now: float) -> None:
        super().__init__(limits.first_message_s, now)
        self.limits = limits
        self.last_audio = now
        self.pause_deadline: float | None = None
        self.context_limit: int | None = None
        # Set by the prepare: when a unit's finalize runs, and a unit's slices
        # of an image where its chunk does not say.
        self.deferred_finalize = True
        self.max_slice_nums = 1
        self.largest_unit = 0  # positions the largest unit so far added
        self._last_length = 0
        self.failed_units = 0  # in a row
        self.units = 0  # results presented
        self.finalizing = False  # a deferred finalize is in flight
        self._unit: _InFlight | None = None

    def configure_units(
        self, deferred_finalize: bool, max_slice_nums: int, window: ContextWindow | None
    ) -> None:
        """What the prepare asks of the unit loop. A context that slides has
        no limit to end at (a limit is for a fixed context)."""
        self.deferred_finalize = deferred_finalize
        self.max_slice_nums = max_slice_nums
        if window is not None and window.mode is not WindowMode.OFF:
            self.context_limit = None

    def prepared(self, now: float) -> list:
        held = super().prepared(now)
        self.last_audio = now
        return held

    def options(self) -> None:
        """A dialect's options (the Realtime API's) come before the prepare."""
        if self.phase is not DuplexPhase.WAITING_PREPARE:
            raise ProtocolError(ErrorCode.INVALID_REQUEST, "options come before prepare")

    def audio(self, now: float) -> bool:
        """A chunk came: whether the model hears it (a paused session does not)."""
        self.require_prepared("audio_chunk")
        self.last_audio = now
        return self.phase is DuplexPhase.ACTIVE

    def pause(self, timeout: float | None, now: float) -> float:
        """Pause; returns its length (the default if none is asked, capped)."""
        self.require_prepared("pause")
        seconds = min(timeout or self.limits.pause_s, self.limits.max_pause_s)
        self.phase = DuplexPhase.PAUSED
        self.pause_deadline = now + seconds
        return seconds

    def resume(self, now: float) -> None:
        if self.phase is not DuplexPhase.PAUSED:
            raise ProtocolError(ErrorCode.INVALID_REQUEST, "session is not paused")
        self.phase = DuplexPhase.ACTIVE
        self.pause_deadline = None
        self.last_audio = now

    def update(self) -> None:
        self.require_prepared("update")

    def deadline(self) -> tuple[float, str]:
        if self.phase is DuplexPhase.PAUSED and self.pause_deadline is not None:
            return self.pause_deadline, "pause"
        if self.unprepared:
            return super().deadline()
        return self.last_audio + self.limits.idle_s, "idle"

    # --- the unit loop -------------------------------------------------------------------

    def handle(self, event: UnitEvent) -> list[UnitAction]:
        """Take one event of the unit loop; returns what to do, in order.
        Raises :class:`IllegalTransition` for an event the loop cannot follow
        (a prefill before the previous unit's finalize among them)."""
        match event:
            case ChunkReady(chunk):
                return self._next_unit(chunk)
            case UnitRan(stats, result, started, now, dropped_total):
                unit = self._running(event)
                if self.finalizing:  # its prefill came before the previous unit's finalize
                    raise IllegalTransition("a unit before the previous unit's finalize")
                unit.started, unit.prefilled = started, started + stats.cost_ms / 1000
                return self._result(unit, stats, result, now, dropped_total)
            case UnitFailed(error):
                unit = self._running(event)
                self._unit = None
                self.failed_units += 1
                if self.failed_units >= MAX_FAILED_UNITS:
                    # An engine that keeps failing would fail every second
                    # until the client left.
                    return [GiveUp(error)]
                return [SkipUnit(unit.chunk.index, error)]
            case Finalized(error):
                self.finalizing = False
                if error is not None:
                    return [ReportError(ErrorCode.INFERENCE_ERROR, f"finalize failed: {error}")]
                return []
        raise TypeError(f"not a unit loop event: {event!r}")

    def _next_unit(self, chunk: PendingChunk) -> list[UnitAction]:
        if self._unit is not None:
            raise IllegalTransition("a chunk while a unit is being computed")
        self._unit = _InFlight(chunk)
        # A unit's finalize before the next unit's prefill, the appends between them.
        actions: list[UnitAction] = [AwaitFinalize()] if self.finalizing else []
        actions.append(BetweenUnits())
        slices = chunk.max_slice_nums or self.max_slice_nums
        actions.append(RunUnit(UnitInput(chunk.audio, chunk.frames, slices, chunk.force_listen)))
        return actions

    def _running(self, event: UnitEvent) -> _InFlight:
        if self._unit is None:
            raise IllegalTransition(f"{type(event).__name__} without a unit")
        return self._unit

    def _result(
        self,
        unit: _InFlight,
        stats: PrefillStats,
        result: DuplexUnit,
        now: float,
        dropped_total: int,
    ) -> list[UnitAction]:
        """A unit's result is in: what becomes of it, in order."""
        chunk = unit.chunk
        self._unit = None
        self.failed_units = 0
        self.units += 1
        timing = UnitTiming(
            prefill_ms=(unit.prefilled - unit.started) * 1000,
            generate_ms=(now - unit.prefilled) * 1000,
            session_start=self.started,
            vision_slices=stats.vision_slices,
            vision_tokens=stats.vision_tokens,
            dropped_total=dropped_total,
            audio_tokens=stats.audio_tokens,
            text_tokens=stats.text_tokens + result.input_text_tokens,
        )
        recorded = {
            "prefill_ms": round(timing.prefill_ms, 1),
            "generate_ms": round(timing.generate_ms, 1),
            "kv_cache_length": result.kv_cache_length,
        }
        mode: UnitMode = "LISTEN" if result.is_listen else "SPEAK"
        actions: list[UnitAction] = [
            Present(result, chunk, timing),
            RecordUnit(chunk, result, mode, recorded),
        ]
        if not self.deferred_finalize:
            actions.append(Finalize(deferred=False))
        actions.append(SendPresented())
        ended = self.unit_done(result.kv_cache_length, result.context_capacity)
        if ended is not None:
            actions.append(End(ended))  # the last unit is not finalized: nothing follows
        elif self.deferred_finalize:
            self.finalizing = True
            actions.append(Finalize(deferred=True))
        return actions

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

"""The worker's full-duplex session rules, without sockets or an engine:
its phases and deadlines, and its unit loop (the steps of a unit, the order
of a finalize and the next prefill, what is recorded, how it ends)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from omnilive.engines.base import EngineError
from omnilive.engines.messages import DuplexUnit, PrefillStats, UnitInput
from omnilive.protocol.common import ErrorCode, ProtocolError
from omnilive.transitions import IllegalTransition
from omnilive.worker.chunk_buffer import PendingChunk
from omnilive.worker.machines.duplex import (
    MAX_FAILED_UNITS,
    AwaitFinalize,
    BetweenUnits,
    ChunkReady,
    DuplexMachine,
    DuplexPhase,
    End,
    Finalize,
    Finalized,
    GiveUp,
    Limits,
    Present,
    RecordUnit,
    ReportError,
    RunUnit,
    SendPresented,
    SkipUnit,
    UnitFailed,
    UnitRan,
)
from omnilive.worker.machines.session import MAX_HELD, Ended

LIMITS = Limits(first_message_s=30, idle_s=60, pause_s=60, max_pause_s=300)


def prepared(now: float = 0.0) -> DuplexMachine:
    machine = DuplexMachine(LIMITS, now)
    machine.prepare()
    machine.prepared(now)
    return machine


def refused(code: ErrorCode, call, *args) -> None:
    with pytest.raises(ProtocolError) as error:
        call(*args)
    assert error.value.code is code


def test_nothing_but_prepare_before_it():
    machine = DuplexMachine(LIMITS, 0.0)
    refused(ErrorCode.NOT_READY, machine.audio, 1.0)
    refused(ErrorCode.NOT_READY, machine.pause, None, 1.0)
    refused(ErrorCode.NOT_READY, machine.update)
    refused(ErrorCode.INVALID_REQUEST, machine.resume, 1.0)
    assert machine.phase is DuplexPhase.WAITING_PREPARE


def test_messages_during_a_prepare_wait_for_it_and_a_stop_does_not():
    machine = DuplexMachine(LIMITS, 0.0)
    assert not machine.hold("too early")  # nothing is being prepared: handle it now
    machine.prepare()
    refused(ErrorCode.INVALID_REQUEST, machine.prepare)
    assert machine.hold("chunk 1") and machine.hold("chunk 2")
    assert machine.prepared(5.0) == ["chunk 1", "chunk 2"]
    assert machine.phase is DuplexPhase.ACTIVE and machine.started == 5.0
    stopping = DuplexMachine(LIMITS, 0.0)
    stopping.prepare()
    assert stopping.stop("user_stop") == Ended("stopped", detail="user_stop")
    assert stopping.prepared(1.0) == []  # the prepare that finishes later changes nothing
    assert stopping.phase is DuplexPhase.ENDED


def test_a_failed_prepare_may_be_retried_and_hands_back_what_waited():
    machine = DuplexMachine(LIMITS, 0.0)
    machine.prepare()
    machine.hold("chunk")
    assert machine.prepare_failed() == ["chunk"]  # handled now: they get not_ready
    assert machine.phase is DuplexPhase.WAITING_PREPARE
    machine.prepare()
    with pytest.raises(IllegalTransition):
        DuplexMachine(LIMITS, 0.0).prepared(1.0)


def test_what_is_held_is_bounded():
    machine = DuplexMachine(LIMITS, 0.0)
    machine.prepare()
    for n in range(MAX_HELD + 5):
        machine.hold(n)
    held = machine.prepared(1.0)
    assert len(held) == MAX_HELD and held[-1] == MAX_HELD + 4


def test_pause_hears_nothing_until_resume_and_ends_when_it_expires():
    machine = prepared()
    assert machine.audio(1.0) is True
    assert machine.pause(1000, 2.0) == 300  # capped
    assert machine.pause(None, 2.0) == 60  # the default
    assert machine.audio(3.0) is False
    assert machine.tick(61.0) is None
    assert machine.tick(62.0) == Ended("pause")
    resumed = prepared()
    resumed.pause(None, 1.0)
    resumed.resume(2.0)
    assert resumed.phase is DuplexPhase.ACTIVE and resumed.audio(3.0) is True


def test_deadlines():
    unprepared = DuplexMachine(LIMITS, 0.0)
    assert unprepared.deadline() == (30.0, "idle")
    assert unprepared.tick(29.9) is None and unprepared.tick(30.0) == Ended("idle")
    active = prepared(10.0)
    active.audio(20.0)
    assert active.deadline() == (80.0, "idle")


def test_the_first_ending_wins_and_the_context_limit_ends_it():
    machine = prepared()
    machine.context_limit = 100
    assert machine.unit_done(99) is None
    assert machine.unit_done(100) == Ended("context_full")
    assert machine.stop() == Ended("context_full")
    assert machine.disconnected() == Ended("context_full")
    gone = prepared()
    assert gone.disconnected() == Ended("disconnected", tell_client=False)


def test_a_context_that_cannot_take_two_more_units_ends_it():
    """Whatever the window (a fixed context, or one the next unit would
    outgrow), a session ends context_full before a unit could fail for
    want of room; the first unit's growth (the system prompt's too) is no
    unit's size."""
    machine = prepared()
    assert machine.unit_done(3000, capacity=8192) is None  # a long system prompt
    for length in range(3100, 7900, 100):  # units of 100
        assert machine.unit_done(length, capacity=8192) is None, length
    assert machine.unit_done(8000, capacity=8192) == Ended("context_full")


def test_a_sessions_own_window_over_the_engines():
    from omnilive.engines.messages import ContextWindow, WindowMode
    from omnilive.protocol.common import ContextWindowOption, ProtocolError
    from omnilive.worker.machines.duplex import window_for

    engine = ContextWindow(WindowMode.BASIC, 4000, 3500)
    assert window_for(engine, None) is engine and window_for(None, None) is None
    off = window_for(engine, ContextWindowOption.model_validate("off"))
    assert off == ContextWindow(WindowMode.OFF, 4000, 3500)
    own = window_for(engine, ContextWindowOption(high_tokens=6000))
    assert (own.mode, own.high_tokens, own.low_tokens) == (WindowMode.BASIC, 6000, 3500)
    with pytest.raises(ProtocolError, match="low_tokens"):
        window_for(engine, ContextWindowOption(low_tokens=5000))


# --- stop, pause and the deadlines in every phase ------------------------------------------


def in_phase(phase: DuplexPhase) -> DuplexMachine:
    machine = DuplexMachine(LIMITS, 0.0)
    if phase is not DuplexPhase.WAITING_PREPARE:
        machine.prepare()
    if phase in (DuplexPhase.ACTIVE, DuplexPhase.PAUSED):
        machine.prepared(1.0)
    if phase is DuplexPhase.PAUSED:
        machine.pause(None, 2.0)
    assert machine.phase is phase
    return machine


@pytest.mark.parametrize("phase", [p for p in DuplexPhase if p is not DuplexPhase.ENDED])
def test_a_stop_ends_the_session_in_every_phase(phase):
    machine = in_phase(phase)
    assert machine.stop("bye") == Ended("stopped", detail="bye")
    assert machine.phase is DuplexPhase.ENDED and machine.ended == Ended("stopped", detail="bye")
    assert machine.tick(10_000.0) == Ended("stopped", detail="bye")  # no deadline after it
    assert machine.prepared(3.0) == [] and machine.prepare_failed() == []


def test_the_deadline_of_each_phase():
    assert in_phase(DuplexPhase.WAITING_PREPARE).deadline() == (30.0, "idle")
    assert in_phase(DuplexPhase.PREPARING).deadline() == (30.0, "idle")  # a prepare in flight
    active = in_phase(DuplexPhase.ACTIVE)
    assert active.deadline() == (61.0, "idle")  # from the prepare
    active.audio(5.0)
    assert active.deadline() == (65.0, "idle")  # each chunk puts it off
    paused = in_phase(DuplexPhase.PAUSED)
    assert paused.deadline() == (62.0, "pause")
    paused.audio(50.0)  # chunks do not put a pause off
    assert paused.tick(62.0) == Ended("pause")
    resumed = in_phase(DuplexPhase.PAUSED)
    resumed.resume(40.0)
    assert resumed.deadline() == (100.0, "idle")  # the resume counts as activity


def test_options_come_before_the_prepare_and_resume_only_after_a_pause():
    machine = DuplexMachine(LIMITS, 0.0)
    machine.options()
    machine.prepare()
    refused(ErrorCode.INVALID_REQUEST, machine.options)
    machine.prepared(1.0)
    refused(ErrorCode.INVALID_REQUEST, machine.resume, 2.0)


# --- the unit loop ---------------------------------------------------------------------


def chunk(index: int = 0, **fields) -> PendingChunk:
    audio = np.full(16_000, 0.01, dtype=np.float32)
    return PendingChunk(index, received_at=0.0, received_wall=1e9, audio=audio, **fields)


def listen(kv: int = 100, **fields) -> DuplexUnit:
    return DuplexUnit(is_listen=True, kv_cache_length=kv, **fields)


def kinds(actions: list) -> list[type]:
    return [type(a) for a in actions]


STATS = PrefillStats(vision_slices=1, vision_tokens=64, audio_tokens=25, text_tokens=2)


def ran(unit: DuplexUnit, t: float = 10.0, prefill_ms: float = 200.0, dropped: int = 0) -> UnitRan:
    """A unit's result: begun at ``t``, its prefill ``prefill_ms`` of 400 ms."""
    return UnitRan(dataclasses.replace(STATS, cost_ms=prefill_ms), unit, t, t + 0.4, dropped)


def run_unit(machine: DuplexMachine, unit: DuplexUnit, index: int = 0, t: float = 10.0) -> list:
    """One unit (400 ms from ``t``); returns what the machine answers to its result."""
    actions = machine.handle(ChunkReady(chunk(index)))
    assert kinds(actions)[-1] is RunUnit
    return machine.handle(ran(unit, t))


def test_a_unit_is_the_appends_then_the_unit_as_one_step_its_prefill_share_its_cost():
    machine = prepared(5.0)
    machine.max_slice_nums = 2  # the prepare's
    given = chunk(frames=[b"jpeg"], force_listen=True)
    between, run = machine.handle(ChunkReady(given))
    assert between == BetweenUnits() and isinstance(run, RunUnit)
    assert run.given == UnitInput(given.audio, [b"jpeg"], 2, True)
    speak = DuplexUnit(False, "hi", None, True, 300, input_text_tokens=3)
    stats = dataclasses.replace(STATS, cost_ms=250.0)
    present, record, send, finalize = machine.handle(UnitRan(stats, speak, 10.0, 10.75, 4))
    assert isinstance(present, Present) and present.unit is speak and present.chunk is given
    timing = present.timing
    assert timing.prefill_ms == pytest.approx(250.0) and timing.generate_ms == pytest.approx(500.0)
    assert (timing.session_start, timing.dropped_total) == (5.0, 4)
    assert (timing.vision_slices, timing.vision_tokens, timing.audio_tokens) == (1, 64, 25)
    assert timing.text_tokens == 5  # the prefill's and the generate's own
    assert isinstance(record, RecordUnit) and send == SendPresented()
    assert finalize == Finalize(deferred=True) and machine.units == 1


def test_a_chunk_that_names_its_slices_overrides_the_sessions():
    machine = prepared()
    *_, run = machine.handle(ChunkReady(chunk(max_slice_nums=5)))
    assert run.given.max_slice_nums == 5


def test_a_deferred_finalize_runs_after_the_send_and_before_the_next_prefill():
    machine = prepared()
    assert kinds(run_unit(machine, listen(100))) == [Present, RecordUnit, SendPresented, Finalize]
    assert machine.finalizing
    # The next chunk came while the finalize runs: its unit waits for it...
    assert kinds(machine.handle(ChunkReady(chunk(1)))) == [AwaitFinalize, BetweenUnits, RunUnit]
    with pytest.raises(IllegalTransition, match="finalize"):
        machine.handle(ran(listen(200), 11.0))  # ...and may not pass it
    machine2 = prepared()
    run_unit(machine2, listen(100))
    assert machine2.handle(Finalized()) == [] and not machine2.finalizing
    # A finalize that ended before the next chunk came: nothing to wait for.
    assert kinds(machine2.handle(ChunkReady(chunk(1)))) == [BetweenUnits, RunUnit]
    assert kinds(machine2.handle(ran(listen(200), 11.0)))[0] is Present


def test_without_deferral_the_finalize_runs_before_the_send():
    machine = prepared()
    machine.deferred_finalize = False
    actions = run_unit(machine, listen(100))
    assert kinds(actions) == [Present, RecordUnit, Finalize, SendPresented]
    assert actions[2] == Finalize(deferred=False) and not machine.finalizing
    assert machine.handle(Finalized()) == []
    assert kinds(machine.handle(ChunkReady(chunk(1)))) == [BetweenUnits, RunUnit]


def test_a_failed_finalize_is_reported_and_the_loop_goes_on():
    machine = prepared()
    run_unit(machine, listen(100))
    assert machine.handle(Finalized("oom")) == [
        ReportError(ErrorCode.INFERENCE_ERROR, "finalize failed: oom")
    ]
    assert kinds(machine.handle(ChunkReady(chunk(1)))) == [BetweenUnits, RunUnit]


def test_what_a_unit_records():
    machine = prepared()
    given = chunk(dropped_before=2)
    machine.handle(ChunkReady(given))
    speak = DuplexUnit(False, "hello", np.zeros(24_000, np.float32), True, 321)
    _, record, *_ = machine.handle(
        UnitRan(dataclasses.replace(STATS, cost_ms=123.46), speak, 10.0, 10.5, 0)
    )
    assert record.chunk is given and record.unit is speak and record.mode == "SPEAK"
    assert record.timing == {"prefill_ms": 123.5, "generate_ms": 376.5, "kv_cache_length": 321}
    machine.handle(Finalized())
    _, heard, *_ = run_unit(machine, listen(400), index=1)
    assert heard.mode == "LISTEN"


def test_units_failing_in_a_row_end_the_session_once():
    machine = prepared()
    errors = [EngineError(f"bad {n}") for n in range(5)]

    def fail(index: int, error: EngineError) -> list:
        machine.handle(ChunkReady(chunk(index)))
        return machine.handle(UnitFailed(error))

    assert fail(0, errors[0]) == [SkipUnit(0, errors[0])]  # no finalize: nothing to finalize
    assert SkipUnit(0, errors[0]).message == "unit failed: bad 0"
    assert fail(1, errors[1]) == [SkipUnit(1, errors[1])]
    run_unit(machine, listen(100), index=2)  # a unit that succeeds starts the count again
    machine.handle(Finalized())
    for n in range(MAX_FAILED_UNITS - 1):
        assert fail(3 + n, errors[2 + n]) == [SkipUnit(3 + n, errors[2 + n])]
    last = errors[MAX_FAILED_UNITS + 1]
    assert fail(9, last) == [GiveUp(last)]  # the third in a row


def test_a_unit_that_failed_is_over():
    machine = prepared()
    machine.handle(ChunkReady(chunk(0)))
    error = EngineError("no")
    assert machine.handle(UnitFailed(error)) == [SkipUnit(0, error)]
    with pytest.raises(IllegalTransition):
        machine.handle(ran(listen()))  # that unit is over


def test_a_full_context_ends_the_session_after_the_result_is_sent_without_its_finalize():
    machine = prepared()
    machine.context_limit = 150
    assert kinds(run_unit(machine, listen(100))) == [Present, RecordUnit, SendPresented, Finalize]
    machine.handle(Finalized())
    actions = run_unit(machine, listen(150), index=1)
    assert kinds(actions) == [Present, RecordUnit, SendPresented, End]
    assert actions[-1] == End(Ended("context_full")) and machine.phase is DuplexPhase.ENDED
    assert not machine.finalizing


def test_a_context_without_room_for_two_more_units_ends_it_as_the_engine_says():
    machine = prepared()
    assert kinds(run_unit(machine, listen(1000, context_capacity=2200)))[-1] is Finalize
    machine.handle(Finalized())
    actions = run_unit(machine, listen(1400, context_capacity=2200), index=1)  # a unit of 400
    assert kinds(actions)[-1] is Finalize  # 1400 + 2 * 400 fits, just
    machine.handle(Finalized())
    actions = run_unit(machine, listen(1401, context_capacity=2200), index=2)
    assert actions[-1] == End(Ended("context_full"))


def test_the_loop_cannot_take_a_chunk_while_a_unit_runs():
    machine = prepared()
    machine.handle(ChunkReady(chunk(0)))
    with pytest.raises(IllegalTransition):
        machine.handle(ChunkReady(chunk(1)))
    with pytest.raises(TypeError):
        machine.handle("chunk")  # type: ignore[arg-type]


def test_the_prepare_sets_the_loop_and_a_sliding_window_lifts_the_context_limit():
    from omnilive.engines.messages import ContextWindow, WindowMode

    machine = prepared()
    machine.context_limit = 150  # the Realtime API's
    machine.configure_units(False, 3, ContextWindow(WindowMode.OFF, 4000, 3500))
    assert (machine.deferred_finalize, machine.max_slice_nums) == (False, 3)
    assert machine.context_limit == 150  # a fixed context ends at its limit
    machine.configure_units(True, 1, None)
    assert machine.context_limit == 150
    machine.configure_units(True, 1, ContextWindow(WindowMode.BASIC, 4000, 3500))
    assert machine.context_limit is None  # it slides: nothing to end at
    assert kinds(run_unit(machine, listen(10_000)))[-1] is Finalize

"""The worker's full-duplex session rules, without sockets or an engine."""

from __future__ import annotations

import pytest

from omnilive.protocol.common import ErrorCode, ProtocolError
from omnilive.transitions import IllegalTransition
from omnilive.worker.machines.duplex import DuplexMachine, Limits
from omnilive.worker.machines.session import MAX_HELD, Ended, Phase

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
    assert machine.phase is Phase.WAITING_PREPARE


def test_messages_during_a_prepare_wait_for_it_and_a_stop_does_not():
    machine = DuplexMachine(LIMITS, 0.0)
    assert not machine.hold("too early")  # nothing is being prepared: handle it now
    machine.prepare()
    refused(ErrorCode.INVALID_REQUEST, machine.prepare)
    assert machine.hold("chunk 1") and machine.hold("chunk 2")
    assert machine.prepared(5.0) == ["chunk 1", "chunk 2"]
    assert machine.phase is Phase.ACTIVE and machine.started == 5.0
    stopping = DuplexMachine(LIMITS, 0.0)
    stopping.prepare()
    assert stopping.stop("user_stop") == Ended("stopped", detail="user_stop")
    assert stopping.prepared(1.0) == []  # the prepare that finishes later changes nothing
    assert stopping.phase is Phase.ENDED


def test_a_failed_prepare_may_be_retried_and_hands_back_what_waited():
    machine = DuplexMachine(LIMITS, 0.0)
    machine.prepare()
    machine.hold("chunk")
    assert machine.prepare_failed() == ["chunk"]  # handled now: they get not_ready
    assert machine.phase is Phase.WAITING_PREPARE
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
    assert resumed.phase is Phase.ACTIVE and resumed.audio(3.0) is True


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


def test_units_failing_in_a_row_end_the_session_once():
    machine = prepared()
    assert machine.unit_failed() and machine.unit_failed()
    machine.unit_succeeded()
    assert machine.unit_failed() and machine.unit_failed()
    assert not machine.unit_failed()  # the third in a row


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

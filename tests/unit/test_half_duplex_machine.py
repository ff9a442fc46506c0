"""The worker's half-duplex session rules, without sockets, VAD or engine."""

from __future__ import annotations

import math

import pytest

from omnilive.protocol.common import ErrorCode, ProtocolError
from omnilive.transitions import IllegalTransition
from omnilive.worker.machines.half_duplex import HalfDuplexMachine, HalfDuplexPhase
from omnilive.worker.machines.session import Ended


def listening(timeout_s: float = 180.0, now: float = 0.0) -> HalfDuplexMachine:
    machine = HalfDuplexMachine(30.0, now)
    machine.prepare()
    machine.prepared_with(timeout_s, now)
    return machine


def test_audio_is_refused_before_the_prepare_and_held_during_it():
    machine = HalfDuplexMachine(30.0, 0.0)
    with pytest.raises(ProtocolError) as refused:
        machine.audio(1.0)
    assert refused.value.code is ErrorCode.NOT_READY
    machine.prepare()
    assert machine.hold("chunk")
    assert machine.prepared_with(60.0, 2.0) == ["chunk"]
    assert machine.phase is HalfDuplexPhase.LISTENING and machine.deadline() == (62.0, "timeout")


def test_answering_hears_nothing_and_stops_the_clock():
    machine = listening(10.0)
    assert machine.audio(5.0) is True
    machine.speech_ended()
    assert machine.audio(6.0) is False  # echo of the answer: not heard
    assert machine.deadline()[0] == math.inf and machine.tick(1000.0) is None
    machine.answered(1000.0)
    assert machine.deadline() == (1010.0, "timeout")
    assert machine.tick(1010.0) == Ended("timeout")


def test_with_barge_in_the_answer_is_heard_over_and_an_interruption_listens_again():
    machine = HalfDuplexMachine(30.0, 0.0)
    machine.prepare()
    machine.prepared_with(10.0, 0.0, barge_in=True)
    machine.speech_ended()
    assert machine.audio(6.0) is True  # the user may speak over the answer
    assert machine.deadline()[0] == math.inf  # still answering: no inactivity clock
    machine.answered(7.0)  # the interrupted answer is over
    assert machine.phase is HalfDuplexPhase.LISTENING and machine.audio(7.5) is True


def test_turn_rules():
    machine = listening()
    with pytest.raises(IllegalTransition):
        machine.answered(1.0)  # no turn in progress
    machine.speech_ended()
    with pytest.raises(IllegalTransition):
        machine.speech_ended()  # one turn at a time


def test_a_stop_ends_it_in_any_phase_even_mid_answer():
    machine = listening()
    machine.speech_ended()
    assert machine.stop() == Ended("stopped")
    machine.answered(5.0)  # the answer that ends later changes nothing
    assert machine.phase is HalfDuplexPhase.ENDED
    preparing = HalfDuplexMachine(30.0, 0.0)
    preparing.prepare()
    preparing.stop()
    assert preparing.prepared_with(60.0, 1.0) == [] and preparing.phase is HalfDuplexPhase.ENDED


def test_not_prepared_in_time():
    machine = HalfDuplexMachine(30.0, 0.0)
    assert machine.tick(29.0) is None
    assert machine.tick(30.0) == Ended("idle")

"""The client's session rules without sockets: server messages and user calls in,
actions and outcomes out."""

from __future__ import annotations

import pytest

from omnilive.client.errors import (
    BackendError,
    ConnectionLostError,
    NotReadyError,
    ProtocolViolationError,
    QueueFullError,
    ServerShutdownError,
    SessionClosedError,
    WorkerFailedError,
)
from omnilive.client.events import Prepared, SessionClosed, SessionTimeout, Stopped
from omnilive.client.machine import (
    ClientMachine,
    CloseSocket,
    Deliver,
    ModeRules,
    Ready,
    Send,
    SessionState,
)
from omnilive.client.realtime import STOP as REALTIME_STOP
from omnilive.client.realtime import closed_as_failure
from omnilive.protocol import common, half_duplex, realtime, realtime_v2

PREPARE = {"type": "prepare"}
HALF_DUPLEX = ModeRules(ready=(Prepared,), ends=(Stopped, SessionTimeout), stop={"type": "stop"})
REALTIME = ModeRules(
    ready=(),
    ends=(SessionClosed,),
    stop=REALTIME_STOP,
    stop_while_waiting=True,
    failure=closed_as_failure,
)
PREPARED = half_duplex.prepared_message("hd_1", 180, None)


def opened(rules: ModeRules = HALF_DUPLEX) -> ClientMachine:
    machine = ClientMachine(rules, PREPARE)
    assert machine.opened() == []
    return machine


def test_queued_then_configured_then_ready():
    machine = opened()
    actions = machine.received(common.queued_message(2, 30.0, "q_1", 2))
    assert [type(a) for a in actions] == [Deliver]
    assert (machine.queue.position, machine.queue.estimated_wait_s) == (2, 30.0)
    machine.received(common.queue_update_message(1, 15.0, 1))
    assert machine.queue.position == 1 and machine.state is SessionState.WAITING
    actions = machine.received(common.QUEUE_DONE)
    assert actions[1:] == [Send(PREPARE)] and machine.state is SessionState.CONFIGURING
    actions = machine.received(PREPARED)
    assert isinstance(actions[-1], Ready) and machine.state is SessionState.ACTIVE
    assert machine.queue.done


def test_data_before_ready_and_a_second_queue_done_are_violations():
    machine = opened()
    with pytest.raises(ProtocolViolationError):
        machine.received(half_duplex.turn_done_message(0, "early"))
    machine.received(common.QUEUE_DONE)
    with pytest.raises(ProtocolViolationError):
        machine.received(half_duplex.vad_state_message(True))
    machine.received(PREPARED)
    with pytest.raises(ProtocolViolationError):
        machine.received(common.QUEUE_DONE)


def test_the_user_may_send_only_while_active():
    machine = opened()
    with pytest.raises(NotReadyError):
        machine.check_sendable()
    machine.received(common.QUEUE_DONE)
    machine.received(PREPARED)
    machine.check_sendable()
    assert machine.stop() == [Send({"type": "stop"})]
    assert machine.stop() == []  # once
    with pytest.raises(SessionClosedError):
        machine.check_sendable()
    machine.received(half_duplex.STOPPED)
    assert machine.closed(1000) is None and isinstance(machine.ending, Stopped)


def test_an_error_just_before_the_close_is_the_outcome():
    machine = opened()
    machine.received(common.error_message("queue is full", common.ErrorCode.QUEUE_FULL))
    outcome = machine.closed(1013, "queue is full")
    assert isinstance(outcome, QueueFullError) and outcome.details["close_code"] == 1013


def test_an_error_the_session_survived_is_not_the_outcome():
    machine = opened()
    machine.received(common.QUEUE_DONE)
    machine.received(PREPARED)
    machine.received(common.error_message("turn 0 failed", common.ErrorCode.INFERENCE_ERROR))
    machine.received(half_duplex.turn_done_message(1, "fine again"))
    outcome = machine.closed(1006, "")
    assert isinstance(outcome, ConnectionLostError) and "1006" in outcome.message


def test_leaving_while_queued_closes_the_socket_and_is_no_failure():
    machine = opened()
    machine.received(common.queued_message(1, 3.0, "q", 1))
    assert machine.stop() == [CloseSocket()]
    assert machine.closed(1000) is None


def test_the_realtime_api_is_stopped_even_while_queued_and_fails_by_its_close():
    machine = opened(REALTIME)
    assert machine.stop() == [Send(REALTIME_STOP)]
    failed = opened(REALTIME)
    failed.received(realtime_v2.closed_event("rt", "backend_error", "the engine failed"))
    outcome = failed.closed(1011)
    assert isinstance(outcome, BackendError) and outcome.message == "the engine failed"
    shutdown = opened(REALTIME)
    shutdown.received(realtime.closed_event(realtime.CloseReason.SERVER_SHUTDOWN))
    assert isinstance(shutdown.closed(1000), ServerShutdownError)
    # the older dialect names the cause in an error just before its close
    lost = opened(REALTIME)
    lost.received(realtime.error_event("worker_failed", "the worker died"))
    lost.received(realtime.closed_event(realtime.CloseReason.ERROR))
    assert isinstance(lost.closed(1000), WorkerFailedError)
    fine = opened(REALTIME)
    fine.received(realtime.closed_event(realtime.CloseReason.CONTEXT_FULL))
    assert fine.closed(1000) is None and fine.ending.reason == "context_full"


def test_chat_sends_its_request_at_once_and_ends_with_done():
    rules = ModeRules(ready=(), ends=(), stop=None, configure_on_open=True)
    machine = ClientMachine(rules, {"messages": []})
    assert machine.opened() == [Send({"messages": []})]
    machine.received(common.queued_message(1, 3.0, "q", 1))  # queue events come after it
    assert machine.stop() == [CloseSocket()]


def test_events_after_the_close_are_ignored():
    machine = opened()
    machine.closed(1000)
    assert machine.received(common.QUEUE_DONE) == []
    assert machine.failed(ProtocolViolationError("late")) == [CloseSocket()]
    assert isinstance(machine.outcome, ConnectionLostError)  # the first outcome stays

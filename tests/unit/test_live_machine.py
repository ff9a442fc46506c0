"""The Live API's gateway machine, without sockets: nothing queues before a
valid ``session.start``, refusals by name leave the connection open, events
wait (bounded) while queued, and every end is an error, then
``session.closed``, then the close."""

from __future__ import annotations

import json
from typing import Any

import pytest

from omnilive.gateway.live.machine import MAX_HELD_EVENTS, LiveMachine, LiveState
from omnilive.gateway.realtime.machine import Close, ToClient, ToWorker
from omnilive.protocol.realtime import CloseReason
from omnilive.transitions import IllegalTransition

START = {"type": "session.start", "event_id": "s", "session": {"model": "gpt-live-1"}}
AUDIO = {"type": "session.input_audio.append", "audio": "AAAA"}


def machine() -> LiveMachine:
    return LiveMachine("live_test", 1 << 20, 600.0, clock=lambda: 1000.0)


def frame(m: LiveMachine, event: dict[str, Any]) -> list[Any]:
    return m.client_frame(json.dumps(event))


def errors(actions: list[Any]) -> list[tuple[str, str | None]]:
    return [
        (a.event["error"]["code"], a.event["error"].get("client_event_id"))
        for a in actions
        if isinstance(a, ToClient) and a.event["type"] == "error"
    ]


def test_nothing_is_queued_before_a_valid_start() -> None:
    m = machine()
    assert errors(frame(m, {**AUDIO, "event_id": "a"})) == [("session_not_started", "a")]
    refused = {**START, "session": {"model": "m", "store": True}}
    assert errors(frame(m, refused)) == [("unsupported", "s")]
    assert m.state is LiveState.WAITING_START and not m.started
    assert frame(m, START) == []
    assert m.state is LiveState.QUEUED and m.expires_at == 1600
    assert errors(frame(m, START)) == [("session_already_started", "s")]


def test_events_wait_while_queued_and_go_in_order() -> None:
    m = machine()
    frame(m, START)
    frame(m, AUDIO)
    frame(m, {"type": "session.input_audio.mute"})
    start, *held = m.attach_worker()
    assert isinstance(start, ToWorker) and start.message["type"] == "internal.live"
    assert start.message["event_id"] == "s"
    assert [h.message["type"] for h in held] == [AUDIO["type"], "session.input_audio.mute"]
    assert [type(a) for a in frame(m, AUDIO)] == [ToWorker]
    with pytest.raises(IllegalTransition):
        m.attach_worker()


def test_audio_goes_first_when_too_much_waits() -> None:
    m = machine()
    frame(m, START)
    for _ in range(MAX_HELD_EVENTS + 10):
        frame(m, AUDIO)
    assert m.dropped_appends == 10
    mute = {"type": "session.input_audio.mute"}
    for _ in range(MAX_HELD_EVENTS):
        frame(m, mute)
    assert errors(frame(m, {**mute, "event_id": "late"})) == [("too_many_events", "late")]


def test_what_the_gateway_knows_it_checks() -> None:
    m = machine()
    frame(m, START)
    m.attach_worker()
    long = {"type": "session.thinking.append", "content": "x" * 3000, "event_id": "t"}
    assert errors(frame(m, long)) == [("content_too_long", "t")]
    assert errors(frame(m, {"type": "response.create", "event_id": "r"})) == [
        ("responses_delegation_required", "r")
    ]
    responses = {"type": "responses", "responses": {"model": "x"}}
    change = {"type": "session.update", "event_id": "u", "session": {"delegation": responses}}
    assert errors(frame(m, change)) == [("immutable_parameter", "u")]
    assert errors(m.client_frame("{not json")) == [("invalid_json", None)]


def test_an_update_is_the_whole_session_merged() -> None:
    m = machine()
    frame(m, START)
    m.attach_worker()
    update = {"type": "session.update", "session": {"delegation": {"type": "client",
              "acknowledgement_delay_ms": 250}}}  # fmt: skip
    [sent] = frame(m, update)
    assert sent.message["session"]["model"] == "gpt-live-1"
    assert sent.message["session"]["delegation"]["acknowledgement_delay_ms"] == 250


def test_close_while_queued_is_answered_here_and_while_active_by_the_worker() -> None:
    m = machine()
    frame(m, START)
    closed, close = frame(m, {"type": "session.close", "event_id": "c"})
    assert closed.event["type"] == "session.closed" and closed.event["reason"] == "close_requested"
    assert closed.event["client_event_id"] == "c" and close == Close(1000)
    active = machine()
    frame(active, START)
    active.attach_worker()
    [to_worker] = frame(active, {"type": "session.close"})
    assert isinstance(to_worker, ToWorker)


@pytest.mark.parametrize(
    ("reason", "code", "why", "close"),
    [
        (CloseReason.TIMEOUT, "session_expired", "expired", 1000),
        (CloseReason.SERVER_SHUTDOWN, "server_shutdown", "remote_hangup", 1000),
        (CloseReason.ERROR, "server_error", "connection_lost", 1011),
    ],
)
def test_server_ends_say_why_then_close(
    reason: CloseReason, code: str, why: str, close: int
) -> None:
    m = machine()
    frame(m, START)
    error, closed, last = m.end(reason)
    assert error.event["error"]["code"] == code
    assert closed.event["type"] == "session.closed" and closed.event["reason"] == why
    assert last == Close(close)
    assert m.end(reason) == [] and frame(m, AUDIO) == []

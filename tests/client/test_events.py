"""The client reads every field of every message the server's own code builds:
if the server grows a field or a message, these fail until the client types it."""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import pytest

from omnilive.audio import pcm_to_b64
from omnilive.client.errors import ProtocolViolationError
from omnilive.client.events import (
    AudioDelta,
    ChatDone,
    Chunk,
    Event,
    Listen,
    Queued,
    ResponseDone,
    Result,
    ServerError,
    SessionClosed,
    SessionCreated,
    Speech,
    TextDelta,
    UnknownEvent,
    parse_event,
)
from omnilive.engines.messages import DuplexUnit
from omnilive.gateway.realtime.chat_machine import RealtimeChatMachine
from omnilive.gateway.realtime.machine import ToClient
from omnilive.protocol import chat, common, duplex, half_duplex, realtime, realtime_v2
from omnilive.protocol.chat import ChatRequest
from omnilive.worker.chunk_buffer import PendingChunk
from omnilive.worker.presenter_v2 import RealtimeV2Presenter
from omnilive.worker.presenters import DuplexPresenter, UnitTiming

SPEECH = (np.arange(2400, dtype=np.float32) / 2400).astype(np.float32)
AUDIO = pcm_to_b64(SPEECH)
WIRE_NAMES = {"text_delta": "text", "audio_data": "audio"}


def read_fully(message: dict[str, Any]) -> Event:
    """Parse ``message``; every field must land in a typed attribute, unchanged."""
    message = json.loads(json.dumps(message))  # as it travels
    event = parse_event(message)
    assert not isinstance(event, UnknownEvent), message["type"]
    assert dict(event.extra) == {}, f"{message['type']}: untyped fields {sorted(event.extra)}"
    for key, value in message.items():
        if key in ("type", "kind") or isinstance(event, ServerError):
            continue
        got = getattr(event, WIRE_NAMES.get(key, key))
        if isinstance(got, np.ndarray):
            assert np.array_equal(got, SPEECH), key
        else:
            assert got == value, key
    return event


def test_every_mode_s_messages():
    messages = [
        common.queued_message(2, 14.0, "q_1", 3),
        common.queue_update_message(1, 7.0, 2),
        common.QUEUE_DONE,
        chat.prefill_done_message(12),
        chat.chunk_message("Hel", AUDIO),
        chat.done_message("Hello", 3, 12, AUDIO, "chat_1", {"total_ms": 5.0}, ["w"]),
        half_duplex.prepared_message("hd_1", 180.0, "hd_rec", ["no voice"]),
        half_duplex.vad_state_message(True),
        half_duplex.generating_message(1234.0),
        half_duplex.turn_done_message(0, "Hi."),
        half_duplex.interrupted_message(1),
        half_duplex.timeout_message(180.0),
        half_duplex.STOPPED,
        duplex.prepared_message("adx_1", 20, "adx_rec", "audio_duplex", {"vision": False}),
        duplex.paused_message(30.0),
        duplex.timeout_message("idle", 60.0),
        duplex.updated_message(["system_prompt"], []),
        duplex.RESUMED,
        realtime.created_event("rt_1", 40, "rt_rec"),
        realtime.delta_event("Hi", AUDIO, True, 80),
        realtime.listen_event(81),
        realtime.updated_event({"instructions": "x"}, ["no voice"]),
        realtime.cancelled_event(),
        realtime.closed_event(realtime.CloseReason.CONTEXT_FULL),
        realtime_v2.closed_event("rt_1", "backend_error", "it broke", {"total_tokens": 3}),
    ]
    for message in messages:
        read_fully(message)
    assert isinstance(read_fully(realtime.delta_event("Hi", AUDIO, True, 80)), Speech)


def test_queue_events_are_the_same_in_the_realtime_api():
    for kind, name in realtime.QUEUE_EVENT_NAMES.items():
        plain = parse_event({**common.queued_message(1, 3.0, "q", 1), "type": kind})
        named = parse_event({**common.queued_message(1, 3.0, "q", 1), "type": name})
        assert type(plain) is type(named)
    assert isinstance(parse_event({**common.queued_message(1, 3.0, "q", 1)}), Queued)


def test_errors_of_both_shapes():
    plain = read_fully(common.error_message("no such voice", common.ErrorCode.INVALID_REQUEST))
    event = read_fully(realtime.error_event(realtime.RealtimeErrorCode.MISSING_FIELD, "audio"))
    assert isinstance(plain, ServerError) and isinstance(event, ServerError)
    assert (plain.code, plain.message) == ("invalid_request", "no such voice")
    assert (event.code, event.message, event.kind) == ("missing_field", "audio", "client_error")
    assert type(event.exception()).__name__ == "MissingFieldError"


def _unit(is_listen: bool, end: bool = False) -> DuplexUnit:
    audio = None if is_listen else SPEECH
    return DuplexUnit(is_listen=is_listen, text="" if is_listen else "Hi", audio=audio,
                      end_of_turn=end, kv_cache_length=90, n_tokens=2, n_tts_tokens=4)  # fmt: skip


def test_duplex_results_and_the_newer_dialect_s_deltas():
    chunk = PendingChunk(3, time.monotonic(), time.time(), SPEECH, input_id="in_1")
    timing = UnitTiming(10.0, 20.0, time.monotonic() - 5, 1, 64, 0, 25, 0)
    (result,) = DuplexPresenter().unit(_unit(False, end=True), chunk, timing)
    event = read_fully(result)
    assert isinstance(event, Result) and event.end_of_turn and event.unit_index == 3

    presenter = RealtimeV2Presenter("rt_1")
    read_fully(presenter.prepared("rt_1", 30, "rec", {"warnings": ["w"]}))
    kinds = [read_fully(d) for d in presenter.unit(_unit(False, end=True), chunk, timing)]
    assert [type(k) for k in kinds] == [TextDelta, AudioDelta, Listen]
    assert {k.response_id for k in kinds} == {kinds[0].response_id} and kinds[0].input_id == "in_1"
    (listen,) = [read_fully(d) for d in presenter.unit(_unit(True), chunk, timing)]
    assert isinstance(listen, Listen) and listen.kv_cache_length == 90
    assert listen.usage and listen.chunk_index == 1


def test_the_newer_dialect_s_chat_answers():
    machine = RealtimeChatMachine("rt_1", lambda data: ChatRequest.model_validate(data))
    machine.queue_event({"type": "queue_done"})
    created = machine.client_frame(json.dumps({"type": "session.init", "payload": {}}))
    assert isinstance(read_fully(created[0].event), SessionCreated)
    question = {"messages": [{"role": "user", "content": "hi"}], "input_id": "in_7"}
    machine.client_frame(json.dumps({"type": "input.append", "input": question}))
    out = machine.worker_message(json.dumps(chat.chunk_message("Hel", AUDIO)))
    out += machine.worker_message(json.dumps(chat.done_message("Hel", 1, 2, None, "rec", {}, [])))
    events = [read_fully(action.event) for action in out if isinstance(action, ToClient)]
    assert [type(e) for e in events] == [TextDelta, AudioDelta, ResponseDone]
    assert all(e.input_id == "in_7" for e in events)


def test_unknown_messages_pass_and_broken_ones_raise():
    event = parse_event({"type": "response.future", "x": 1})
    assert isinstance(event, UnknownEvent) and event.data["x"] == 1
    extra = parse_event({"type": "turn_done", "turn_index": 1, "text": "", "new": True})
    assert extra.extra == {"new": True}
    with pytest.raises(ProtocolViolationError):
        parse_event({"no": "type"})
    with pytest.raises(ProtocolViolationError):
        parse_event({"type": "vad_state"})  # a required field missing
    with pytest.raises(ProtocolViolationError):
        parse_event({"type": "chunk", "text_delta": "a", "audio_data": "not base64!"})


def test_media_events_decode_audio_and_chat_done_may_have_none():
    chunk = parse_event(chat.chunk_message("a", AUDIO))
    assert isinstance(chunk, Chunk) and chunk.audio is not None and chunk.audio.dtype == np.float32
    done = parse_event(chat.done_message("a", 1, 1, None, None, {}))
    assert isinstance(done, ChatDone) and done.audio is None
    closed = parse_event(realtime_v2.closed_event("rt", "backend_error", "why"))
    assert isinstance(closed, SessionClosed) and closed.message == "why"

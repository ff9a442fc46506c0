"""The OpenAI Realtime (GA) dialect without sockets: the gateway's machine,
the typed client events, the conversation's items, the audio formats, and
conformance: every server event omnilive emits parses into the ``openai``
package's own typed model of that event."""

from __future__ import annotations

import json
import typing

import numpy as np
import pytest
from openai.types.realtime.realtime_server_event import RealtimeServerEvent
from pydantic import TypeAdapter

from omnilive.audio_codecs import decode_input, encode_output
from omnilive.engines.messages import ToolCall
from omnilive.gateway.openai.machine import MAX_HELD_EVENTS, OpenAIRealtimeMachine, OpenAIState
from omnilive.gateway.realtime.machine import Close, ToClient, ToWorker
from omnilive.protocol.common import ErrorCode, ProtocolError
from omnilive.protocol.openai_realtime import (
    ResponseParams,
    SessionConfig,
    error_event,
    parse_client_event,
    server_event,
    session_object,
)
from omnilive.protocol.realtime import CloseReason
from omnilive.transitions import IllegalTransition
from omnilive.worker.openai.items import Conversation, client_item
from omnilive.worker.openai.machine import options
from omnilive.worker.openai.presenter import ResponsePresenter, usage

SERVER_EVENTS = TypeAdapter(RealtimeServerEvent)
_BY_TYPE = {
    typing.get_args(m.model_fields["type"].annotation)[0]: m
    for m in typing.get_args(typing.get_args(RealtimeServerEvent)[0])
}


def conforms(event: dict) -> None:
    """``event`` validates strictly as the openai package's model of its type."""
    model = _BY_TYPE[event["type"]]
    model.model_validate(json.loads(json.dumps(event)))
    SERVER_EVENTS.validate_python(json.loads(json.dumps(event)))


def machine() -> OpenAIRealtimeMachine:
    return OpenAIRealtimeMachine("sess_x", "m", 1 << 20)


def client(actions: list) -> list[dict]:
    return [a.event for a in actions if isinstance(a, ToClient)]


def worker(actions: list) -> list[dict]:
    return [a.message for a in actions if isinstance(a, ToWorker)]


# --- the gateway machine ----------------------------------------------------------------


def test_created_at_once_and_configuration_merged_while_queued():
    m = machine()
    [created] = client(m.created())
    conforms(created)
    assert created["session"]["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    first = {"type": "session.update", "session": {"type": "realtime", "instructions": "A"}}
    second = {"type": "session.update", "session": {"output_modalities": ["text"]}}
    assert m.client_frame(json.dumps(first)) == []
    assert m.client_frame(json.dumps(second)) == []
    [start] = worker(m.attach_worker())
    assert start["type"] == "internal.openai" and m.state is OpenAIState.ACTIVE
    assert start["updated"] is True  # the worker answers session.updated
    assert start["session"]["instructions"] == "A"
    assert start["session"]["output_modalities"] == ["text"]
    with pytest.raises(IllegalTransition):
        m.attach_worker()


def test_the_queue_is_told_in_openais_own_shape():
    """Only events of OpenAI's union by default: the wait is ``rate_limits.updated``
    (the Python Agents SDK makes an error event of any unknown type)."""
    m = machine()
    assert m.queue_event({"type": "queue_done"}) == []  # never queued: nothing to tell
    waiting = client(m.queue_event({"type": "queued", "position": 2, "estimated_wait_s": 7.5,
                                    "ticket_id": "t", "queue_length": 3}))  # fmt: skip
    done = client(m.queue_event({"type": "queue_done"}))
    for event in waiting + done:
        conforms(event)
    assert [e["type"] for e in waiting + done] == ["rate_limits.updated"] * 2
    assert waiting[0]["rate_limits"] == [
        {"name": "requests", "limit": 1, "remaining": 0, "reset_seconds": 7.5}
    ]
    assert done[0]["rate_limits"][0]["remaining"] == 1
    assert worker(m.attach_worker())[0]["extensions"] is False


def test_omnilive_extensions_add_the_queue_position():
    m = OpenAIRealtimeMachine("sess_x", "m", 1 << 20, extensions=True)
    events = client(m.queue_event({"type": "queued", "position": 2, "estimated_wait_s": 1.0,
                                   "ticket_id": "t", "queue_length": 3}))  # fmt: skip
    events += client(m.queue_event({"type": "queue_done"}))
    kinds = [e["type"] for e in events]
    assert kinds == [
        "rate_limits.updated", "omnilive.queue.waiting", "rate_limits.updated",
        "omnilive.queue.done",
    ]  # fmt: skip
    assert events[1]["position"] == 2
    assert worker(m.attach_worker())[0]["extensions"] is True


def test_audio_held_while_queued_is_bounded_oldest_first():
    m = machine()
    append = json.dumps({"type": "input_audio_buffer.append", "audio": "AAAA"})
    for _ in range(MAX_HELD_EVENTS + 10):
        assert client(m.client_frame(append)) == []
    assert m.dropped_appends == 10
    start, *held = worker(m.attach_worker())
    assert start["dropped_appends"] == 10 and len(held) == MAX_HELD_EVENTS


@pytest.mark.parametrize(
    ("raw", "code", "param"),
    [
        ("not json", "invalid_json", None),
        ("[1]", "invalid_json", None),
        ('{"event_id": "e"}', "missing_required_parameter", "type"),
        ('{"type": "bogus"}', "invalid_value", "type"),
        ('{"type": "input_audio_buffer.append"}', "missing_required_parameter", "audio"),
        ('{"type": "input_audio_buffer.append", "audio": "%%%"}', "invalid_value", "audio"),
        (
            '{"type": "conversation.item.truncate", "item_id": "i", "content_index": -1,'
            ' "audio_end_ms": 0}',
            "invalid_value",
            "content_index",
        ),
        ('{"type": "session.update", "session": {"tool_choice": 3}}', "invalid_value", None),
        # OpenAI's bounds: one or both modalities, 1 to 4096 tokens or "inf".
        (
            '{"type": "session.update", "session": {"output_modalities": []}}',
            "invalid_value",
            "session.output_modalities",
        ),
        (
            '{"type": "session.update", "session": {"max_output_tokens": -1}}',
            "invalid_value",
            "session.max_output_tokens",
        ),
        (
            '{"type": "session.update", "session": {"max_output_tokens": 0}}',
            "invalid_value",
            "session.max_output_tokens",
        ),
        (
            '{"type": "session.update", "session": {"max_output_tokens": 1e30}}',
            "invalid_value",
            "session.max_output_tokens",
        ),
        (
            json.dumps({"type": "session.update", "session": {"max_output_tokens": 10**30}}),
            "invalid_value",
            "session.max_output_tokens",
        ),
        (
            '{"type": "response.create", "response": {"max_output_tokens": -5}}',
            "invalid_value",
            "response.max_output_tokens",
        ),
        (
            '{"type": "conversation.item.create", "item": {"type": "message", "role": "robot",'
            ' "content": []}}',
            "invalid_value",
            None,
        ),
    ],
)
def test_bad_events_are_openai_errors_and_the_session_goes_on(raw, code, param):
    m = machine()
    m.attach_worker()
    [error] = client(m.client_frame(raw))
    conforms(error)
    assert error["error"]["code"] == code
    if param is not None:
        assert error["error"]["param"] == param
    assert m.state is OpenAIState.ACTIVE
    ok = worker(m.client_frame('{"type": "input_audio_buffer.clear", "event_id": "c1"}'))
    assert ok == [{"type": "input_audio_buffer.clear", "event_id": "c1"}]


def test_an_error_names_the_client_event():
    m = machine()
    [error] = client(m.client_frame('{"type": "nope", "event_id": "evt_1"}'))
    assert error["error"]["event_id"] == "evt_1"


def test_oversized_events_are_refused():
    m = OpenAIRealtimeMachine("s", "m", 100)
    [error] = client(
        m.client_frame(json.dumps({"type": "input_audio_buffer.append", "audio": "A" * 200}))
    )
    assert error["error"]["code"] == "payload_too_large"


@pytest.mark.parametrize("reason", list(CloseReason))
def test_server_ends_are_an_error_then_a_close(reason):
    m = machine()
    actions = m.end(reason)
    assert isinstance(actions[-1], Close) and m.state is OpenAIState.CLOSED
    for event in client(actions):
        conforms(event)
    assert m.end(reason) == [] and m.client_frame("{}") == []


def test_session_update_merges_one_level_down():
    config = SessionConfig().updated(
        SessionConfig.model_validate({"audio": {"input": {"turn_detection": None}}})
    )
    assert config.audio.input.turn_detection is None
    assert config.audio.output.format.type == "audio/pcm"
    assert config.output_modalities == ["audio"]
    conforms(server_event("session.updated", session=session_object("s", config, "m")))


def test_every_client_event_type_parses():
    events = [
        {"type": "session.update", "session": {"type": "realtime"}},
        {"type": "input_audio_buffer.append", "audio": "AAAA"},
        {"type": "input_audio_buffer.commit"},
        {"type": "input_audio_buffer.clear"},
        {
            "type": "conversation.item.create",
            "item": {"type": "function_call_output", "call_id": "c", "output": "o"},
        },
        {"type": "conversation.item.retrieve", "item_id": "i"},
        {"type": "conversation.item.delete", "item_id": "i"},
        {
            "type": "conversation.item.truncate",
            "item_id": "i",
            "content_index": 0,
            "audio_end_ms": 10,
        },
        {"type": "response.create", "response": {"instructions": "x", "tool_choice": "none"}},
        {"type": "response.cancel"},
        {"type": "output_audio_buffer.clear"},
    ]
    for event in events:
        assert parse_client_event(event).type == event["type"]


# --- the worker's conversation and presenter ----------------------------------------------


def test_conversation_items_insert_delete_truncate():
    c = Conversation()
    a = client_item(
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}, "a"
    )
    assert c.add(a) is None
    b = {
        "id": "b",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_audio", "transcript": "one two three four"}],
    }
    assert c.add(b) == "a"
    root = client_item(
        {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "first"}]},
        "r",
    )
    assert c.add(root, "root") is None
    assert list(c.items) == ["r", "a", "b"]
    c.truncate("b", 0, 500, 1000.0)
    assert c.get("b")["content"][0]["transcript"] == "one two"
    with pytest.raises(ProtocolError) as exc:
        c.truncate("a", 0, 0, 0)
    assert exc.value.code == "invalid_value"
    messages = c.messages("be kind")
    assert [m.role for m in messages] == ["system", "system", "user", "assistant"]
    c.delete("a")
    with pytest.raises(ProtocolError) as exc:
        c.get("a", "evt")
    assert exc.value.code == "item_not_found" and exc.value.event_id == "evt"


@pytest.mark.parametrize("audio", [True, False])
def test_every_response_event_conforms(audio):
    conversation = Conversation()
    conversation.add({"id": "prev", "type": "message", "role": "user", "content": []})
    presenter = ResponsePresenter(audio, "audio/pcm", conversation, metadata={"k": "v"})
    events = presenter.created()
    events += presenter.chunk("Hello ", np.zeros(2400, np.float32))
    events += presenter.chunk("world.", None)
    events += presenter.tool_call(ToolCall("call_1", "get_weather", '{"city": "Paris"}'))
    events += presenter.done("completed", usage(10, 5, audio))
    for event in events:
        conforms(event)
    kinds = [e["type"] for e in events]
    text_kind = "response.output_audio_transcript" if audio else "response.output_text"
    assert f"{text_kind}.delta" in kinds and f"{text_kind}.done" in kinds
    assert ("response.output_audio.delta" in kinds) is audio
    done = events[-1]["response"]
    assert [item["type"] for item in done["output"]] == ["message", "function_call"]
    assert done["output"][1]["arguments"] == '{"city": "Paris"}'


def test_a_cancelled_response_conforms():
    presenter = ResponsePresenter(True, "audio/pcmu", Conversation())
    events = presenter.chunk("Hel", np.zeros(2400, np.float32))
    events += presenter.done("cancelled", usage(1, 1, True), "turn_detected")
    for event in events:
        conforms(event)
    details = events[-1]["response"]["status_details"]
    assert details == {"type": "cancelled", "reason": "turn_detected"}  # no null error
    assert events[-1]["response"]["output"][0]["status"] == "incomplete"


def test_an_added_event_shows_its_item_as_it_was_and_the_item_joins_at_once():
    """Events are sent after the presenter goes on changing the item: an
    ``.added`` one must still show it in progress (the JS Agents SDK runs a
    tool on an ``.added`` item that says completed, and again on ``.done``),
    and the item is in the conversation from then on (a client may truncate
    the answer it hears)."""
    conversation = Conversation()
    presenter = ResponsePresenter(True, "audio/pcm", conversation)
    events = presenter.chunk("Hello ", np.zeros(2400, np.float32))
    item_id = events[0]["item"]["id"]
    assert list(conversation.items) == [item_id]
    events += presenter.tool_call(ToolCall("call_1", "get_weather", "{}"))
    events += presenter.done("completed", usage(1, 1, True))
    added = [e for e in events if e["type"].endswith("item.added")]
    assert [e["item"]["status"] for e in added] == ["in_progress"] * 4
    assert added[0]["item"]["content"] == []
    call = next(e["item"] for e in added if e["item"]["type"] == "function_call")
    assert call["arguments"] == ""
    done = [e["item"]["status"] for e in events if e["type"] == "response.output_item.done"]
    assert done == ["completed", "completed"]
    assert len(conversation.items) == 2


def test_a_failed_response_says_why():
    presenter = ResponsePresenter(False, "audio/pcm", None)
    error = {"type": "server_error", "code": "inference_error", "message": "boom"}
    events = presenter.done("failed", usage(1, 0, False), None, error)
    conforms(events[-1])
    response = events[-1]["response"]
    assert response["status_details"] == {"type": "failed", "error": error}
    assert "conversation_id" not in response  # out of band: in no conversation


def test_worker_side_events_conform():
    item = {
        "id": "item_1",
        "object": "realtime.item",
        "type": "message",
        "role": "user",
        "status": "completed",
        "content": [{"type": "input_audio", "transcript": "hi"}],
    }
    error = {"type": "transcription_error", "code": "unsupported", "message": "m", "param": None}
    for event in [
        server_event("input_audio_buffer.speech_started", audio_start_ms=10, item_id="item_1"),
        server_event("input_audio_buffer.speech_stopped", audio_end_ms=900, item_id="item_1"),
        server_event("input_audio_buffer.committed", previous_item_id=None, item_id="item_1"),
        server_event("input_audio_buffer.cleared"),
        server_event("conversation.item.added", previous_item_id=None, item=item),
        server_event("conversation.item.done", item=item),
        server_event("conversation.item.retrieved", item=item),
        server_event("conversation.item.deleted", item_id="item_1"),
        server_event("conversation.item.truncated", item_id="i", content_index=0, audio_end_ms=5),
        server_event(
            "conversation.item.input_audio_transcription.delta",
            item_id="i",
            content_index=0,
            delta="hi",
        ),
        server_event(
            "conversation.item.input_audio_transcription.completed",
            item_id="i",
            content_index=0,
            transcript="hi",
            usage={"type": "duration", "seconds": 0},
        ),
        server_event(
            "conversation.item.input_audio_transcription.failed",
            item_id="i",
            content_index=0,
            error=error,
        ),
        error_event("item_not_found", "no such item", "item_id", "evt_1"),
    ]:
        conforms(event)


@pytest.mark.parametrize("fmt", ["audio/pcm", "audio/pcmu", "audio/pcma"])
def test_audio_formats_round_trip(fmt):
    t = np.arange(24_000) / 24_000
    tone = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    heard = decode_input(encode_output(tone, fmt), fmt)  # 24 kHz out, 16 kHz in
    assert abs(heard.size - 16_000) <= 2
    reference = (0.3 * np.sin(2 * np.pi * 440 * np.arange(heard.size) / 16_000)).astype(np.float32)
    assert np.sqrt(np.mean((heard - reference) ** 2)) < 0.03


def test_duplex_units_as_responses_conform():
    from omnilive.engines.messages import DuplexUnit
    from omnilive.worker.openai.duplex_presenter import OpenAIDuplexPresenter

    config = SessionConfig()
    conversation = Conversation()
    presenter = OpenAIDuplexPresenter(
        lambda: config, lambda: session_object("s", config, "m-duplex"), conversation
    )
    speech = np.zeros(24_000, np.float32)
    units = [
        DuplexUnit(is_listen=True),
        DuplexUnit(is_listen=False, text="Hello ", audio=speech, n_tokens=2),
        DuplexUnit(is_listen=False, text="there.", audio=speech, end_of_turn=True, n_tokens=2),
        DuplexUnit(is_listen=False, text="Again", audio=speech, n_tokens=1),
    ]
    events = [e for unit in units for e in presenter.unit(unit, None, None)]  # type: ignore[arg-type]
    events += presenter.close("cancelled", "turn_detected")
    assert presenter.unit(units[3], None, None) == []  # type: ignore[arg-type]  # muted
    assert presenter.unit(units[0], None, None) == []  # type: ignore[arg-type]  # listening again
    events += presenter.unit(units[3], None, None)  # type: ignore[arg-type]
    events += [presenter.updated([], []), presenter.error(ErrorCode.INFERENCE_ERROR, "x")]
    for event in events:
        conforms(event)
    done = [e["response"] for e in events if e["type"] == "response.done"]
    assert [d["status"] for d in done] == ["completed", "cancelled"]
    assert done[0]["output"][0]["content"][0]["transcript"] == "Hello there."
    assert len(conversation.items) == 3  # the third response's item joined as it was added


def test_error_params_name_fields_as_openai_does():
    cases = {
        '{"type": "conversation.item.create", "item": {"type": "message", "role": "robot",'
        ' "content": []}}': "item.role",
        '{"type": "session.update", "session": {"tool_choice": 3}}': "session.tool_choice",
        '{"type": "session.update", "session": {"audio": {"input": {"turn_detection":'
        ' {"type": "server_vad", "threshold": 5}}}}}':
        "session.audio.input.turn_detection.threshold",
        '{"type": "response.create", "response": {"input": [{"type": "item_reference"}]}}':
        "response.input.0.id",
    }  # fmt: skip
    for raw, param in cases.items():
        with pytest.raises(ProtocolError) as exc:
            parse_client_event(json.loads(raw))
        assert exc.value.param == param


def test_the_beta_temperature_is_honoured_and_shown_only_when_set():
    """Clients written for the beta API send ``temperature``; 0 is greedy.
    A session that never set it looks as OpenAI's GA one (no such field)."""
    plain = SessionConfig()
    assert "temperature" not in session_object("s", plain, "m")
    assert options(plain).generation.do_sample  # the engine's own sampling
    greedy = plain.updated(SessionConfig.model_validate({"temperature": 0}))
    shown = server_event("session.updated", session=session_object("s", greedy, "m"))
    conforms(shown)
    assert shown["session"]["temperature"] == 0
    assert options(greedy).generation.greedy
    warmer = options(greedy, ResponseParams(temperature=0.9)).generation
    assert warmer.do_sample and warmer.temperature == 0.9  # one response's own
    m = machine()
    m.attach_worker()
    too_hot = {"type": "session.update", "session": {"temperature": 7}}
    [error] = client(m.client_frame(json.dumps(too_hot)))
    conforms(error)
    assert error["error"]["code"] == "invalid_value"
    assert error["error"]["param"] == "session.temperature"

"""The Realtime API's state machine and its output framing, without I/O."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from omnilive.engines.messages import DuplexUnit
from omnilive.gateway.realtime.machine import (
    Close,
    RealtimeMachine,
    RealtimeState,
    ToClient,
    ToWorker,
)
from omnilive.protocol.internal import Envelope
from omnilive.protocol.realtime import DEFAULT_INSTRUCTIONS
from omnilive.transitions import IllegalTransition
from omnilive.worker.chunk_buffer import PendingChunk
from omnilive.worker.presenters import RealtimePresenter, UnitTiming

AUDIO = base64.b64encode(np.zeros(16000, "<f4").tobytes()).decode()


def frame(event: dict) -> str:
    return json.dumps(event)


def machine(state: RealtimeState = RealtimeState.QUEUED) -> RealtimeMachine:
    m = RealtimeMachine("video", "rt_1", 8192)
    if state is not RealtimeState.QUEUED:
        m.queue_event({"type": "queue_done"})
        m.attach_worker()
    if state is RealtimeState.ACTIVE:
        m.client_frame(frame({"type": "session.update", "session": {"instructions": "hi"}}))
        m.worker_event(Envelope("session.created"))
    return m


def codes(actions) -> list[str]:
    return [a.event["error"]["code"] for a in actions if isinstance(a, ToClient)]


def test_queue_events_are_renamed_and_queue_done_connects():
    m = machine()
    assert m.queue_event({"type": "queued", "position": 1}).event == {
        "type": "session.queued",
        "position": 1,
    }
    assert m.queue_event({"type": "queue_update"}).event["type"] == "session.queue_update"
    assert m.queue_event({"type": "queue_done"}).event["type"] == "session.queue_done"
    assert m.state is RealtimeState.CONNECTED
    with pytest.raises(IllegalTransition):
        m.queue_event({"type": "queue_done"})


def test_appends_while_queued_are_not_ready():
    m = machine()
    append = {"type": "input_audio_buffer.append", "audio": AUDIO}
    assert codes(m.client_frame(frame(append))) == ["not_ready"]
    assert codes(m.client_frame(frame({"type": "response.cancel"}))) == ["not_ready"]
    assert m.state is RealtimeState.QUEUED


def test_an_update_sent_while_queued_is_kept_until_the_worker_is_there():
    """The reference's page sends session.update 100 ms after connecting."""
    m = machine()
    first = {"type": "session.update", "session": {"instructions": "first"}}
    latest = {"type": "session.update", "session": {"instructions": "latest"}}
    assert m.client_frame(frame(first)) == [] and m.client_frame(frame(latest)) == []
    m.queue_event({"type": "queue_done"})
    options, prepare = m.attach_worker()  # the latest one wins
    assert options.message == {"type": "internal.realtime", "dialect": "realtime",
                               "context_limit": 8192}  # fmt: skip
    assert prepare.message["type"] == "prepare" and prepare.message["system_prompt"] == "latest"
    assert m.attach_worker() == []  # applied once
    m.worker_event(Envelope("session.created"))
    assert m.state is RealtimeState.ACTIVE


def test_instructions_are_optional():
    m = machine(RealtimeState.CONNECTED)
    _, prepare = m.client_frame(frame({"type": "session.update", "session": {}}))
    assert prepare.message["system_prompt"] == DEFAULT_INSTRUCTIONS


def test_a_later_update_changes_the_session():
    m = machine(RealtimeState.ACTIVE)
    later = {"type": "session.update", "session": {"instructions": "new", "unknown": 1}}
    [update] = m.client_frame(frame(later))
    assert update.message["type"] == "update" and update.message["system_prompt"] == "new"
    assert m.state is RealtimeState.ACTIVE


def test_an_update_during_the_first_waits_for_it():
    m = machine(RealtimeState.CONNECTED)
    m.client_frame(frame({"type": "session.update", "session": {"instructions": "a"}}))
    assert m.client_frame(frame({"type": "session.update", "session": {"instructions": "b"}})) == []
    [update] = m.worker_event(Envelope("session.created"))
    assert update.message == {"type": "update", "system_prompt": "b", "ref_audio_base64": None,
                              "tts_ref_audio_base64": None, "ref_audio_id": None,
                              "tts_ref_audio_id": None}  # fmt: skip


def test_response_cancel_forces_the_next_unit_to_listen():
    m = machine(RealtimeState.ACTIVE)
    [cancelled] = m.client_frame(frame({"type": "response.cancel"}))
    assert cancelled.event == {"type": "response.cancelled"}
    append = frame({"type": "input_audio_buffer.append", "audio": AUDIO})
    assert m.client_frame(append)[0].message["force_listen"] is True
    assert m.client_frame(append)[0].message["force_listen"] is False  # once


def test_appends_of_any_length_are_taken():
    """OpenAI-style clients send 20 ms; the worker assembles 1 s units."""
    m = machine(RealtimeState.ACTIVE)
    tiny = base64.b64encode(np.zeros(320, "<f4").tobytes()).decode()
    [action] = m.client_frame(frame({"type": "input_audio_buffer.append", "audio": tiny}))
    assert isinstance(action, ToWorker) and action.message["audio_base64"] == tiny


def test_connected_accepts_only_session_update():
    m = machine(RealtimeState.CONNECTED)
    append = {"type": "input_audio_buffer.append", "audio": AUDIO}
    assert codes(m.client_frame(frame(append))) == ["not_ready"]
    options, action = m.client_frame(
        frame({"type": "session.update", "session": {"instructions": "x"}})
    )
    assert options.message["dialect"] == "realtime" and options.message["context_limit"] == 8192
    assert isinstance(action, ToWorker) and action.message["type"] == "prepare"
    assert action.message["mode"] == "omni_duplex" and "dialect" not in action.message
    m.worker_event(Envelope("session.created"))
    assert m.state is RealtimeState.ACTIVE


def test_failed_update_may_be_retried():
    m = machine(RealtimeState.CONNECTED)
    update = frame({"type": "session.update", "session": {"instructions": "x"}})
    m.client_frame(update)
    m.worker_event(Envelope("error"))
    assert isinstance(m.client_frame(update)[0], ToWorker)


@pytest.mark.parametrize(
    ("event", "code"),
    [
        ({"type": "response.create"}, "unknown_event"),
        ({"no": "type"}, "missing_field"),
        ({"type": "session.update"}, "missing_field"),
        ({"type": "session.update", "session": {"instructions": "x", "max_slice_nums": 10}},
         "invalid_payload"),
        ({"type": "session.update", "session": {"instructions": "x", "ref_audio": "@@"}},
         "invalid_payload"),
        ({"type": "input_audio_buffer.append"}, "missing_field"),
        ({"type": "input_audio_buffer.append", "audio": "!!"}, "invalid_payload"),
        ({"type": "input_audio_buffer.append", "audio": ""}, "invalid_payload"),
        ({"type": "input_audio_buffer.append", "audio": "AAAA"}, "invalid_payload"),  # 3 bytes
        ({"type": "input_audio_buffer.append", "audio": AUDIO, "max_slice_nums": 0},
         "invalid_payload"),
        ({"type": "input_audio_buffer.append", "audio": AUDIO, "video_frames": ["%%"]},
         "invalid_payload"),
    ],
)  # fmt: skip
def test_client_errors_do_not_close(event: dict, code: str):
    m = machine(RealtimeState.ACTIVE)
    actions = m.client_frame(frame(event))
    assert codes(actions) == [code]
    assert actions[0].event["error"]["type"] == "client_error"
    assert not any(isinstance(a, Close) for a in actions)
    assert m.state is RealtimeState.ACTIVE


def test_append_translation_keeps_controls_and_frames_only_in_video_mode():
    event = {"type": "input_audio_buffer.append", "audio": AUDIO, "video_frames": ["AAAA"],
             "force_listen": True, "max_slice_nums": 4}  # fmt: skip
    [video] = machine(RealtimeState.ACTIVE).client_frame(frame(event))
    assert video.message == {"type": "audio_chunk", "audio_base64": AUDIO, "force_listen": True,
                             "frame_base64_list": ["AAAA"], "max_slice_nums": 4}  # fmt: skip
    audio = RealtimeMachine("audio", "rt_2", 8192)
    audio.queue_event({"type": "queue_done"})
    audio.attach_worker()
    audio.client_frame(frame({"type": "session.update", "session": {"instructions": "x"}}))
    audio.worker_event(Envelope("session.created"))
    [action] = audio.client_frame(frame(event))
    assert "frame_base64_list" not in action.message


def test_not_json_closes_with_1003_and_json_non_object_does_not():
    m = machine(RealtimeState.ACTIVE)
    assert codes(m.client_frame("[1]")) == ["invalid_payload"]
    assert m.client_frame("{oops") == [Close(1003)]
    assert m.state is RealtimeState.CLOSED
    assert m.client_frame(frame({"type": "session.close"})) == []


def test_close_while_queued_is_immediate_and_later_goes_through_the_worker():
    queued = machine()
    actions = queued.client_frame(frame({"type": "session.close", "reason": "user_stop"}))
    assert actions[0].event == {"type": "session.closed", "reason": "stopped"}
    assert actions[1] == Close()
    # connected but not configured yet: the worker has no realtime session to end
    connected = machine(RealtimeState.CONNECTED)
    actions = connected.client_frame(frame({"type": "session.close"}))
    assert actions == [ToClient({"type": "session.closed", "reason": "stopped"}), Close()]
    active = machine(RealtimeState.ACTIVE)
    assert active.client_frame(frame({"type": "session.close"})) == [ToWorker({"type": "stop"})]
    assert active.worker_event(Envelope("session.closed")) == [Close()]
    assert active.state is RealtimeState.CLOSED


def test_duplex_ends_before_the_first_update_become_session_closed():
    for kind, reason in (("timeout", "timeout"), ("stopped", "stopped")):
        m = machine(RealtimeState.CONNECTED)
        assert not m.forwards(kind) and m.forwards("session.created")
        actions = m.worker_event(Envelope(kind))
        assert actions == [ToClient({"type": "session.closed", "reason": reason}), Close()]
        assert m.state is RealtimeState.CLOSED
    active = machine(RealtimeState.ACTIVE)
    assert active.forwards("timeout")  # an active session's worker speaks realtime


def test_server_side_end_reasons():
    m = machine(RealtimeState.ACTIVE)
    from omnilive.protocol.realtime import CloseReason

    actions = m.end(CloseReason.SERVER_SHUTDOWN)
    assert actions[0].event == {"type": "session.closed", "reason": "server_shutdown"}
    assert m.end(CloseReason.TIMEOUT) == []


def speak(seconds: float, end: bool = False, kv: int = 100) -> DuplexUnit:
    audio = np.arange(round(seconds * 24000), dtype=np.float32)
    return DuplexUnit(is_listen=False, text=f"{seconds}s ", audio=audio, end_of_turn=end,
                      kv_cache_length=kv)  # fmt: skip


def present(presenter: RealtimePresenter, unit: DuplexUnit) -> list[dict]:
    chunk = PendingChunk(0, 0.0, 0.0, np.zeros(16000, np.float32))
    return presenter.unit(unit, chunk, UnitTiming(0, 0, 0, 0, 0, 0))


def lengths(events: list[dict]) -> list[int]:
    return [len(base64.b64decode(e["audio"])) // 4 for e in events]


def test_deltas_are_whole_seconds_in_the_middle():
    p = RealtimePresenter()
    events = []
    for unit in (speak(0.7), speak(0.7), speak(0.7), speak(0.7), speak(0.35, end=True)):
        events.extend(present(p, unit))
    # first goes out at once (shorter), middles are exactly 1 s, the last takes the rest
    sizes = lengths(events)
    assert sizes[0] == 16800 and all(size == 24000 for size in sizes[1:-1])
    assert sum(sizes) == round(24000 * 3.15)
    assert [e["end_of_turn"] for e in events] == [False] * (len(events) - 1) + [True]
    assert "".join(e["text"] for e in events) == "0.7s 0.7s 0.7s 0.7s 0.35s "
    # the audio is the engine's, in order
    joined = np.concatenate([np.frombuffer(base64.b64decode(e["audio"]), "<f4") for e in events])
    assert joined[16800] == 0.0 and joined[16799] == 16799.0


def test_listen_after_interrupted_speech_flushes_then_listens():
    p = RealtimePresenter()
    present(p, speak(1.0))
    assert present(p, speak(0.5)) == []  # waits to fill a second
    events = present(p, DuplexUnit(is_listen=True, kv_cache_length=120))
    assert [e["type"] for e in events] == ["response.output_audio.delta", "response.listen"]
    assert events[0]["end_of_turn"] is True and lengths(events[:1]) == [12000]
    assert events[1] == {"type": "response.listen", "kv_cache_length": 120}
    # a new turn starts fresh: its first delta goes out at once
    assert lengths(present(p, speak(0.4))) == [9600]

"""The Realtime API's newer dialect without I/O: its machines (video/audio and
chat), the worker's presenter, usage accounting and the unit assembler."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from omnilive.engines.messages import DuplexUnit
from omnilive.gateway.realtime.chat_machine import (
    CancelTurn,
    ChatState,
    RealtimeChatMachine,
    StartTurn,
    chat_request,
)
from omnilive.gateway.realtime.machine import Close, RealtimeMachine, RealtimeState
from omnilive.gateway.realtime.machine import ToWorker as W
from omnilive.gateway.realtime.v2_machine import RealtimeV2Machine
from omnilive.protocol.chat import ChatRequest
from omnilive.protocol.internal import Envelope
from omnilive.protocol.realtime import CloseReason
from omnilive.protocol.realtime_v2 import TokenUsage, UsageMeter
from omnilive.worker.chunk_buffer import PendingChunk
from omnilive.worker.presenter_v2 import RealtimeV2Presenter
from omnilive.worker.presenters import UnitTiming
from omnilive.worker.unit_assembler import UnitAssembler


def b64(samples: int) -> str:
    return base64.b64encode(np.zeros(samples, "<f4").tobytes()).decode()


SECOND = b64(16000)
INIT = json.dumps({"type": "session.init", "payload": {"instructions": "Be brief."}})


def append(**fields) -> str:
    return json.dumps({"type": "input.append", "input": {"audio": SECOND, **fields}})


def v2(state: RealtimeState = RealtimeState.QUEUED, mode: str = "video") -> RealtimeV2Machine:
    m = RealtimeV2Machine(mode, "rt_1", 8192)  # type: ignore[arg-type]
    if state is not RealtimeState.QUEUED:
        m.queue_event({"type": "queue_done"})
        m.attach_worker()
    if state is RealtimeState.ACTIVE:
        m.client_frame(INIT)
        m.worker_event(Envelope("session.created"))
    return m


def fatal(actions: list) -> str:
    """The diagnostic of a fatal close (and check that it is one)."""
    closed, close = actions
    assert closed.event["type"] == "session.closed" and closed.event["reason"] == "backend_error"
    assert close == Close(1011, "backend_error")  # the close says why, as the reference's does
    return closed.event["diagnostic"]["message"]


def test_init_becomes_a_prepare_in_this_dialect():
    m = v2(RealtimeState.CONNECTED)
    voice = base64.b64encode(b"RIFF" + bytes(40)).decode()  # a WAV file is a voice too
    init = {"type": "session.init",
            "payload": {"instructions": "hi", "config": {"length_penalty": 1.1},
                        "voice": {"ref_audio": voice}, "surprise": True}}  # fmt: skip
    options, prepare = m.client_frame(json.dumps(init))
    assert options.message["type"] == "internal.realtime"
    assert options.message["dialect"] == "realtime_v2"
    assert prepare.message["system_prompt"] == "hi" and prepare.message["mode"] == "omni_duplex"
    assert prepare.message["ref_audio_base64"] == prepare.message["tts_ref_audio_base64"] == voice
    assert prepare.message["config"] == {"length_penalty": 1.1}
    m.worker_event(Envelope("session.created"))
    assert m.state is RealtimeState.ACTIVE


def test_an_init_while_queued_is_kept():
    m = v2()
    assert m.client_frame(INIT) == []
    m.queue_event({"type": "queue_done"})
    _, prepare = m.attach_worker()
    assert prepare.message["type"] == "prepare"


@pytest.mark.parametrize(
    ("state", "raw", "why"),
    [
        (RealtimeState.CONNECTED, append(), "before session.created"),
        (RealtimeState.ACTIVE, INIT, "once"),
        (RealtimeState.ACTIVE, json.dumps({"type": "session.update"}), "unknown event"),
        (RealtimeState.ACTIVE, "{not json", "JSON"),
        (RealtimeState.ACTIVE, "[1]", "JSON object"),
        (RealtimeState.ACTIVE, json.dumps({"type": "input.append", "input": "x"}), "input"),
        (RealtimeState.ACTIVE, append(audio="!!"), "audio"),
        (RealtimeState.ACTIVE, append(max_slice_nums=[1, 2]), "one entry per frame"),
        (RealtimeState.CONNECTED, json.dumps({"type": "session.init", "payload": 1}), "payload"),
    ],
)
def test_every_violation_is_fatal(state: RealtimeState, raw: str, why: str):
    m = v2(state)
    assert why in fatal(m.client_frame(raw))
    assert m.state is RealtimeState.CLOSED and m.client_frame(append()) == []


def test_append_carries_frames_hints_and_the_input_id():
    m = v2(RealtimeState.ACTIVE)
    hints = {"force_listen": True, "max_slice_nums": 2}
    [chunk] = m.client_frame(append(frames=[{"data": "AAAA"}], hints=hints, input_id="in-7"))
    assert chunk.message == {
        "type": "audio_chunk", "audio_base64": SECOND, "force_listen": True,
        "input_id": "in-7", "frame_base64_list": ["AAAA"], "max_slice_nums": 2,
    }  # fmt: skip
    audio = v2(RealtimeState.ACTIVE, mode="audio")
    [chunk] = audio.client_frame(append(video_frames=["AAAA"]))
    assert "frame_base64_list" not in chunk.message


def test_close_echoes_the_clients_reason_through_the_worker():
    m = v2(RealtimeState.ACTIVE)
    assert m.client_frame(json.dumps({"type": "session.close", "reason": "user_stop"})) == [
        W({"type": "stop", "reason": "user_stop"})
    ]
    closed = Envelope("session.closed", reason="user_stop")
    assert m.worker_event(closed) == [Close(1000)]
    early = v2(RealtimeState.CONNECTED)
    closed_event, close = early.client_frame(json.dumps({"type": "session.close"}))
    assert closed_event.event["reason"] == "client_closed" and close == Close(1000)


def test_worker_errors_and_server_ends():
    m = v2(RealtimeState.ACTIVE)
    assert not m.forwards("error") and m.forwards("response.output.delta")
    assert "boom" in fatal(m.worker_event(Envelope("error", error="internal error: boom")))
    m = v2(RealtimeState.ACTIVE)
    closed, close = m.end(CloseReason.TIMEOUT)
    assert closed.event["reason"] == "timeout" and close == Close(1000)
    m = v2(RealtimeState.CONNECTED)  # before the worker knows the dialect
    assert not m.forwards("timeout")
    assert m.worker_event(Envelope("timeout"))[0].event["reason"] == "timeout"


def test_the_dialect_can_be_chosen_after_queueing():
    older = RealtimeMachine("audio", "rt_9", 100)
    older.queue_event({"type": "queue_done"})
    older.attach_worker()
    m = RealtimeV2Machine.taking_over(older)
    assert m.state is RealtimeState.CONNECTED and m.worker_attached
    assert m.client_frame(INIT)[1].message["mode"] == "audio_duplex"


# --- the worker's presenter ------------------------------------------------------------


def unit(listen: bool = False, text: str = "", seconds: float = 0.0, end: bool = False):
    audio = np.ones(round(seconds * 24000), np.float32) if seconds else None
    return DuplexUnit(is_listen=listen, text=text, audio=audio, end_of_turn=end,
                      kv_cache_length=50, n_tokens=3, n_tts_tokens=7)  # fmt: skip


def present(p: RealtimeV2Presenter, u: DuplexUnit, frames: int = 0, input_id: str = "i"):
    chunk = PendingChunk(0, 0.0, 0.0, np.zeros(16000, np.float32), frames=[b"j"] * frames,
                         input_id=input_id)  # fmt: skip
    timing = UnitTiming(10, 20, 0, frames, 64 * frames, 0, audio_tokens=12, text_tokens=1)
    return p.unit(u, chunk, timing)


def test_speaking_then_listening_in_the_reference_order():
    p = RealtimeV2Presenter("rt_1")
    created = p.prepared("rt_1", 40, "rec", {"warnings": []})
    assert created["mode"] == "full_duplex" and created["usage"]["input_tokens"] == 40
    [listen] = present(p, unit(listen=True))
    assert listen["kind"] == "listen" and "response_id" not in listen
    text, audio = present(p, unit(text="Hi", seconds=0.5), input_id="in-2")
    assert (text["kind"], text["text"], audio["kind"]) == ("text", "Hi", "audio")
    assert text["response_id"] == audio["response_id"] and text["input_id"] == "in-2"
    assert len(base64.b64decode(audio["audio"])) == 4 * 12000 and audio["sample_rate"] == 24000
    assert text["chunk_index"] == audio["chunk_index"] == 1  # every delta of the step
    assert text["usage"] == audio["usage"]
    *_, boundary = present(p, unit(text="bye", seconds=0.2, end=True))
    assert boundary["kind"] == "listen" and boundary["response_id"] == text["response_id"]
    [next_listen] = present(p, unit(listen=True))
    assert "response_id" not in next_listen  # the turn is over
    [again, _] = present(p, unit(text="new", seconds=0.1))
    assert again["response_id"] != text["response_id"]


def test_usage_per_step_and_in_total():
    p = RealtimeV2Presenter("rt_1")
    p.prepared("rt_1", 40, None, {})
    [first] = present(p, unit(listen=True), frames=1)
    assert first["chunk_index"] == 0
    step = first["chunk_usage"]
    assert step["input_token_details"] == {"text_tokens": 1, "audio_tokens": 12, "image_tokens": 0,
                                           "video_tokens": 64, "vision_tokens": 64,
                                           "cached_tokens": 0}  # fmt: skip
    assert step["output_token_details"] == {"text_tokens": 3, "audio_tokens": 7}
    assert step["total_tokens"] == 1 + 12 + 64 + 3 + 7
    [second, *_] = present(p, unit(text="x", seconds=0.1))
    assert second["chunk_index"] == 1
    assert second["usage"]["input_tokens"] == 40 + 2 * (1 + 12) + 64


def test_ends_and_errors_are_session_closed():
    p = RealtimeV2Presenter("rt_1")
    assert p.ended("stopped", 1.0, "user_stop")["reason"] == "user_stop"
    assert p.ended("stopped", 1.0)["reason"] == "client_closed"
    assert p.ended("idle", 1.0)["reason"] == "timeout"
    full = p.ended("context_full", 1.0)
    assert full["reason"] == "backend_error" and "context" in full["diagnostic"]["message"]
    assert p.error("inference_error", "boom")["reason"] == "backend_error"


def test_token_usage_adds_up():
    meter = UsageMeter()
    meter.step(TokenUsage(input_audio=5, output_text=2))
    fields = meter.step(TokenUsage(input_image=3))
    assert fields["chunk_index"] == 1 and fields["usage"]["total_tokens"] == 10


# --- the unit assembler ----------------------------------------------------------------


def test_pieces_of_any_length_make_whole_seconds():
    assembler = UnitAssembler(max_frames=2)
    ramp = np.arange(40_000, dtype=np.float32)
    units = []
    for start in range(0, 40_000, 320):  # 20 ms pieces
        units += assembler.add(ramp[start : start + 320], input_id=str(start))
    assert [u.audio.size for u in units] == [16000, 16000]
    np.testing.assert_array_equal(np.concatenate([u.audio for u in units]), ramp[:32000])
    assert assembler.pending_samples == 8000
    assert units[0].input_id == "15680"  # the piece that completed it


def test_a_long_piece_is_split_and_controls_are_kept():
    assembler = UnitAssembler(max_frames=2)
    assert assembler.add(np.zeros(100, np.float32), frames=[b"a", b"b", b"c"], force_listen=True,
                         max_slice_nums=3) == []  # fmt: skip
    first, second, third = assembler.add(np.zeros(48_000, np.float32))
    assert first.frames == [b"b", b"c"] and first.force_listen and first.max_slice_nums == 3
    assert second.frames == [] and not second.force_listen
    assert third.audio.size == 16000 and assembler.pending_samples == 100


# --- chat over the Realtime API ------------------------------------------------------------


def chat(state: ChatState = ChatState.ACTIVE) -> RealtimeChatMachine:
    m = RealtimeChatMachine("rt_c", lambda data: ChatRequest.model_validate(data))
    if state is not ChatState.QUEUED:
        m.queue_event({"type": "queue_done"})
    if state in (ChatState.ACTIVE, ChatState.RESPONDING):
        m.client_frame(json.dumps({"type": "session.init", "payload": {}}))
    return m


def ask(text: str, **fields) -> str:
    turn = {"messages": [{"role": "user", "content": text}], **fields}
    return json.dumps({"type": "input.append", "input": turn})


def worker(kind: str, **fields) -> str:
    return json.dumps({"type": kind, **fields})


def test_a_chat_turn_streams_deltas_then_done():
    m = chat()
    [start] = m.client_frame(ask("hi", input_id="q1"))
    assert isinstance(start, StartTurn) and start.request.tts.enabled is False
    assert start.request.generation.max_new_tokens == 256
    [text] = m.worker_message(worker("chunk", text_delta="Hel", audio_data=None))
    assert text.event["kind"] == "text" and text.event["input_id"] == "q1"
    [audio] = m.worker_message(worker("chunk", text_delta="", audio_data="AAAAAA=="))
    assert audio.event["kind"] == "audio"
    [done] = m.worker_message(worker("done", text="Hello", input_tokens=9, generated_tokens=2))
    assert done.event["type"] == "response.done" and done.event["text"] == "Hello"
    assert done.event["reason"] == "turn_end" and done.event["usage"]["total_tokens"] == 11
    assert done.event["response_id"] == text.event["response_id"]
    assert m.state is ChatState.ACTIVE and not m.answering(start.serial)


def test_inputs_during_an_answer_wait_their_turn():
    m = chat()
    [first] = m.client_frame(ask("one"))
    assert m.client_frame(ask("two")) == []  # waits
    _, second = m.worker_message(worker("done", text="1"))
    assert isinstance(second, StartTurn) and second.serial == first.serial + 1
    assert m.state is ChatState.RESPONDING


def test_chat_rules():
    queued = chat(ChatState.QUEUED)
    assert queued.client_frame(json.dumps({"type": "session.init", "payload": {}})) == []
    _, created = queued.queue_event({"type": "queue_done"})
    assert created.event["mode"] == "turn_based"
    connected = chat(ChatState.CONNECTED)
    assert "before session.created" in fatal(connected.client_frame(ask("hi")))
    bad = chat()
    assert "messages" in fatal(bad.client_frame(json.dumps({"type": "input.append", "input": {}})))
    answering = chat()
    answering.client_frame(ask("hi"))
    cancel, closed, close = answering.client_frame(json.dumps({"type": "session.close"}))
    assert isinstance(cancel, CancelTurn) and closed.event["reason"] == "client_closed"
    assert close == Close(1000)
    failing = chat()
    failing.client_frame(ask("hi"))
    _, *rest = failing.worker_message(worker("error", error="boom", code="inference_error"))
    assert "boom" in fatal(rest)


def test_use_tts_template_asks_for_speech():
    request = chat_request({"messages": [], "use_tts_template": True, "input_id": "x"})
    assert request["tts"]["enabled"] is True and "input_id" not in request

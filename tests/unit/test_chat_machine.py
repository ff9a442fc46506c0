"""The worker's chat request rules, without sockets; and the runner that drives
them, on the scripted engine with a list for a socket."""

from __future__ import annotations

import asyncio
import base64
import json
import logging

import numpy as np
import pytest

from omnilive.config import load_settings
from omnilive.engines.messages import TextAudioChunk
from omnilive.engines.scripted import ScriptedChat, ScriptedEngine
from omnilive.protocol.chat import ChatRequest
from omnilive.protocol.internal import Envelope
from omnilive.recording.turns import TurnRecorder
from omnilive.transitions import IllegalTransition
from omnilive.worker.machines.chat import (
    ChatMachine,
    ChatState,
    Chunk,
    ClientGone,
    Decoded,
    DecodeFailed,
    DoneSent,
    Generated,
    GenerationFailed,
    Prefilled,
    PrefillStarted,
    Record,
    ToClient,
    UnexpectedError,
    Unsupported,
)
from omnilive.worker.runners import chat as runners_chat
from omnilive.worker.runners.chat import run_chat
from omnilive.worker.runtime import WorkerRuntime

STARTED = 100.0  # the runner's monotonic clock when the request came
REQUEST_TS = 1_700_000_000.0


def pcm(*samples: float) -> np.ndarray:
    return np.array(samples, dtype=np.float32)


def b64_samples(data: str) -> list[float]:
    return np.frombuffer(base64.b64decode(data), "<f4").tolist()


def generating(streaming: bool = True, recording_id: str | None = "chat_x") -> ChatMachine:
    """A machine whose prefill (of 7 tokens) ended 250 ms after the request came."""
    machine = ChatMachine(streaming, STARTED, REQUEST_TS)
    machine.handle(Decoded())
    machine.handle(PrefillStarted(recording_id))
    machine.handle(Prefilled(7, STARTED + 0.25))
    return machine


def sent(actions: list) -> list[dict]:
    assert all(isinstance(a, ToClient) for a in actions), actions
    return [a.message for a in actions]


def recorded(actions: list) -> Record:
    (record,) = [a for a in actions if isinstance(a, Record)]
    return record


# --- the answer ------------------------------------------------------------------------


def test_a_streamed_answer_in_order():
    machine = ChatMachine(True, STARTED, REQUEST_TS)
    assert machine.handle(Decoded()) == [] and machine.state is ChatState.DECODED
    assert machine.handle(PrefillStarted("chat_x")) == []
    assert sent(machine.handle(Prefilled(7, STARTED + 0.25))) == [
        {"type": "prefill_done", "input_tokens": 7}
    ]
    (first,) = sent(machine.handle(Chunk("Hel", pcm(0.5, -0.5), 2, STARTED + 0.3, 1.0)))
    assert first["type"] == "chunk" and first["text_delta"] == "Hel"
    assert b64_samples(first["audio_data"]) == [0.5, -0.5]
    (second,) = sent(machine.handle(Chunk("lo", None, 1, STARTED + 0.4, 2.0)))
    assert second == {"type": "chunk", "text_delta": "lo", "audio_data": None}
    (done,) = sent(machine.handle(Generated(["no clone"], STARTED + 0.5, 3.0)))
    assert machine.state is ChatState.FINISHING  # done until it has gone out
    assert done["type"] == "done" and done["text"] == "Hello"
    assert done["generated_tokens"] == 3 and done["input_tokens"] == 7
    assert done["audio_data"] is None  # a streaming client has it already
    assert done["recording_session_id"] == "chat_x" and done["warnings"] == ["no clone"]
    record = recorded(machine.handle(DoneSent()))
    assert machine.state is ChatState.DONE and machine.ended
    assert record.status == "done" and record.error is None
    assert record.request_ts == REQUEST_TS and record.timings == done["timings"]
    assert record.output.text == ["Hel", "lo"]
    assert [(ts, a.tolist()) for ts, a in record.output.audio] == [(1.0, [0.5, -0.5])]


def test_timings_count_from_the_request():
    machine = ChatMachine(True, STARTED, REQUEST_TS)
    machine.handle(Decoded())
    machine.handle(PrefillStarted(None))
    machine.handle(Prefilled(7, STARTED + 0.25041))
    machine.handle(Chunk("a", None, 1, STARTED + 0.31234, 1.0))
    machine.handle(Chunk("b", None, 1, STARTED + 0.9, 2.0))  # not the first any more
    (done,) = sent(machine.handle(Generated([], STARTED + 1.23456, 3.0)))
    assert done["timings"] == {
        "prefill_ms": 250.4,
        "first_chunk_ms": 312.3,
        "generate_ms": 984.2,  # from the prefill as it was sent
        "total_ms": 1234.6,
    }
    assert list(done["timings"]) == ["prefill_ms", "first_chunk_ms", "generate_ms", "total_ms"]


def test_an_answer_without_chunks_had_its_first_chunk_at_the_end():
    machine = generating()
    (done,) = sent(machine.handle(Generated([], STARTED + 0.75, 3.0)))
    assert done["timings"]["first_chunk_ms"] == 750.0 == done["timings"]["total_ms"]
    assert list(done["timings"]) == ["prefill_ms", "first_chunk_ms", "generate_ms", "total_ms"]
    assert done["text"] == "" and done["generated_tokens"] == 0


def test_a_non_streaming_answer_sends_its_audio_once_with_done():
    machine = generating(streaming=False)
    assert machine.handle(Chunk("a", pcm(0.1), 1, STARTED + 0.3, 1.0)) == []
    assert machine.handle(Chunk("b", None, 1, STARTED + 0.4, 2.0)) == []
    assert machine.handle(Chunk("c", pcm(), 1, STARTED + 0.5, 3.0)) == []  # empty: skipped
    assert machine.handle(Chunk("d", pcm(0.2, 0.3), 2, STARTED + 0.6, 4.0)) == []
    (done,) = sent(machine.handle(Generated([], STARTED + 0.7, 5.0)))
    assert done["text"] == "abcd" and done["generated_tokens"] == 5
    assert b64_samples(done["audio_data"]) == pytest.approx([0.1, 0.2, 0.3])
    record = recorded(machine.handle(DoneSent()))
    # The recording has it in one piece too, placed when it went out.
    assert [(ts, a.size) for ts, a in record.output.audio] == [(5.0, 3)]


def test_a_non_streaming_answer_without_audio_has_none():
    machine = generating(streaming=False)
    machine.handle(Chunk("a", None, 1, STARTED + 0.3, 1.0))
    (done,) = sent(machine.handle(Generated([], STARTED + 0.7, 5.0)))
    assert done["audio_data"] is None
    assert recorded(machine.handle(DoneSent())).output.audio == []


def test_a_streamed_chunk_with_empty_audio_is_sent_but_not_recorded():
    machine = generating()
    (chunk,) = sent(machine.handle(Chunk("a", pcm(), 1, STARTED + 0.3, 1.0)))
    assert chunk["audio_data"] == ""
    machine.handle(Generated([], STARTED + 0.7, 5.0))
    assert recorded(machine.handle(DoneSent())).output.audio == []


def test_an_unrecorded_request_says_so_in_done():
    machine = generating(recording_id=None)
    (done,) = sent(machine.handle(Generated([], STARTED + 0.7, 5.0)))
    assert done["recording_session_id"] is None


# --- refusals and failures -------------------------------------------------------------


@pytest.mark.parametrize(
    ("event", "code"),
    [
        (DecodeFailed("bad image"), "invalid_request"),
        (Unsupported("no video"), "unsupported_capability"),
    ],
)
def test_a_request_that_cannot_be_served_is_refused_and_not_recorded(event, code):
    machine = ChatMachine(True, STARTED, REQUEST_TS)
    assert sent(machine.handle(event)) == [{"type": "error", "error": event.error, "code": code}]
    assert machine.state is ChatState.FAILED


def test_an_engine_failure_while_prefilling_is_recorded_as_failed():
    machine = ChatMachine(True, STARTED, REQUEST_TS)
    machine.handle(Decoded())
    machine.handle(PrefillStarted("chat_x"))
    told, record = machine.handle(GenerationFailed("out of memory"))
    assert told == ToClient(
        {"type": "error", "error": "inference failed: out of memory", "code": "inference_error"}
    )
    assert machine.state is ChatState.FAILED
    assert (record.status, record.error, record.timings) == ("failed", "out of memory", {})


def test_an_engine_failure_mid_answer_keeps_what_was_produced():
    machine = generating()
    machine.handle(Chunk("Hel", pcm(0.5), 1, STARTED + 0.30012, 1.0))
    told, record = machine.handle(GenerationFailed("boom"))
    assert told.message["code"] == "inference_error"
    assert record.status == "failed" and record.output.text == ["Hel"]
    assert record.timings == {"prefill_ms": 250.0, "first_chunk_ms": 300.1}


def test_an_unexpected_error_tells_the_client_and_is_recorded_as_failed():
    machine = generating()
    told, record = machine.handle(UnexpectedError("list index out of range"))
    assert told.message == {
        "type": "error",
        "error": "internal error: list index out of range",
        "code": "inference_error",
    }
    assert machine.state is ChatState.FAILED
    assert (record.status, record.error) == ("failed", "list index out of range")


def test_an_unexpected_error_while_decoding_records_nothing():
    machine = ChatMachine(True, STARTED, REQUEST_TS)
    (told,) = machine.handle(UnexpectedError("oops"))
    assert told.message["code"] == "inference_error" and machine.state is ChatState.FAILED


# --- the client leaving ----------------------------------------------------------------


def test_a_client_gone_mid_answer_is_recorded_as_interrupted():
    machine = generating()
    machine.handle(Chunk("Hel", pcm(0.5), 1, STARTED + 0.3, 1.0))
    record = recorded(machine.handle(ClientGone()))
    assert machine.state is ChatState.CANCELLED and machine.ended
    assert record.status == "interrupted" and record.error is None
    assert record.output.text == ["Hel"] and len(record.output.audio) == 1


def test_a_client_gone_before_done_went_out_is_interrupted_too():
    machine = generating()
    machine.handle(Generated([], STARTED + 0.7, 5.0))
    record = recorded(machine.handle(ClientGone()))
    assert record.status == "interrupted" and record.timings["total_ms"] == 700.0


@pytest.mark.parametrize("opened", [False, True])
def test_a_client_gone_before_the_prefill_records_nothing(opened):
    machine = ChatMachine(True, STARTED, REQUEST_TS)
    if opened:
        machine.handle(Decoded())
    assert machine.handle(ClientGone()) == []
    assert machine.state is ChatState.CANCELLED


# --- illegal transitions ---------------------------------------------------------------


def ended(state: ChatState) -> ChatMachine:
    machine = generating()
    if state is ChatState.DONE:
        machine.handle(Generated([], STARTED + 0.7, 5.0))
        machine.handle(DoneSent())
    elif state is ChatState.FAILED:
        machine.handle(GenerationFailed("boom"))
    else:
        machine.handle(ClientGone())
    assert machine.state is state
    return machine


@pytest.mark.parametrize(
    ("prepare", "event"),
    [
        ([], Prefilled(1, STARTED)),
        ([], PrefillStarted(None)),
        ([], GenerationFailed("too early")),
        ([], DoneSent()),
        ([Decoded()], Decoded()),
        ([Decoded()], Unsupported("too late")),
        ([Decoded()], Chunk("a", None, 1, STARTED, 1.0)),
        ([Decoded(), PrefillStarted(None)], Chunk("a", None, 1, STARTED, 1.0)),
        ([Decoded(), PrefillStarted(None)], Generated([], STARTED, 1.0)),
        ([Decoded(), PrefillStarted(None), Prefilled(1, STARTED)], DecodeFailed("late")),
        ([Decoded(), PrefillStarted(None), Prefilled(1, STARTED)], DoneSent()),
    ],
)
def test_an_event_its_state_cannot_follow_is_illegal(prepare, event):
    machine = ChatMachine(True, STARTED, REQUEST_TS)
    for earlier in prepare:
        machine.handle(earlier)
    before = machine.state
    with pytest.raises(IllegalTransition):
        machine.handle(event)
    assert machine.state is before


def test_nothing_follows_a_complete_answer_but_its_delivery():
    machine = generating()
    machine.handle(Generated([], STARTED + 0.7, 5.0))
    for event in (Chunk("a", None, 1, STARTED, 1.0), UnexpectedError("x"), GenerationFailed("x")):
        with pytest.raises(IllegalTransition):
            machine.handle(event)


@pytest.mark.parametrize("state", [ChatState.DONE, ChatState.FAILED, ChatState.CANCELLED])
@pytest.mark.parametrize("event", [ClientGone(), UnexpectedError("x"), DoneSent(), Decoded()])
def test_an_ended_request_takes_no_event(state, event):
    machine = ended(state)
    with pytest.raises(IllegalTransition):
        machine.handle(event)
    assert machine.state is state


def test_only_events_are_handled():
    with pytest.raises(TypeError):
        ChatMachine(True, STARTED, REQUEST_TS).handle("decoded")  # type: ignore[arg-type]


# --- the runner drives it --------------------------------------------------------------


class FakeRecorder:
    """What the runner hands the recording, kept in memory."""

    recording_id = "chat_rec"

    def __init__(self) -> None:
        self.turns: list[tuple[str, str, str | None]] = []  # status, text, error
        self.closed = False

    async def turn(self, request_ts, source, output, timing, status, error) -> None:
        self.turns.append((status, "".join(output.text), error))

    async def close(self) -> None:
        self.closed = True


async def serve(
    monkeypatch: pytest.MonkeyPatch, text: str, fail_send_at: int = 0, error=None, **options
):
    """One request through ``run_chat``, whose ``fail_send_at``-th send raises
    ``error``: returns its result (or what it raised), what it sent and the recording."""
    recorder = FakeRecorder()
    monkeypatch.setattr(TurnRecorder, "open", lambda *args, **kwargs: recorder)
    settings = load_settings(environ={}, overrides={"engine": "scripted", "internal_token": "t"})
    runtime = WorkerRuntime(ScriptedEngine(settings.scripted), "w")
    await runtime.load()
    messages: list[dict] = []
    message = {"role": "user", "content": text}
    request = ChatRequest.model_validate({"messages": [message], **options})

    async def send(frame: str) -> None:
        messages.append(json.loads(Envelope.split(frame)[1]))
        if len(messages) == fail_send_at:
            raise error

    try:
        async with runtime.session("chat_1", "chat") as record:
            result = await run_chat(runtime, record, request, send, settings)
    except BaseException as exc:
        result = exc
    finally:
        runtime.close()
    return result, messages, recorder


async def test_the_runner_serves_a_request_and_records_it(monkeypatch: pytest.MonkeyPatch):
    result, messages, recorder = await serve(monkeypatch, "hello there")
    assert result is True
    assert messages[0]["type"] == "prefill_done" and messages[-1]["type"] == "done"
    assert messages[-1]["recording_session_id"] == "chat_rec"
    assert recorder.turns == [("done", messages[-1]["text"], None)] and recorder.closed


def broken(*args):
    raise KeyError("slot")


def broken_stream(self):
    yield TextAudioChunk(text="Hel", audio=None, n_tokens=1)
    raise KeyError("slot")


@pytest.mark.parametrize(
    ("target", "name", "fake", "before", "turns"),
    [
        (runners_chat, "decode_chat", broken, [], []),  # nothing opened: nothing recorded
        (ScriptedChat, "prefill", broken, [], [("failed", "", "'slot'")]),
        (ScriptedChat, "generate", broken_stream, ["chunk"], [("failed", "Hel", "'slot'")]),
    ],
)
async def test_an_unexpected_failure_is_told_logged_once_and_recorded(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    target,
    name,
    fake,
    before,
    turns,
):
    monkeypatch.setattr(target, name, fake)
    with caplog.at_level(logging.ERROR, logger="omnilive"):
        result, messages, recorder = await serve(monkeypatch, "hello", streaming=True)
    assert result is False
    told = {"type": "error", "error": "internal error: 'slot'", "code": "inference_error"}
    assert [m["type"] for m in messages if m["type"] != "prefill_done"] == [*before, "error"]
    assert messages[-1] == told
    (logged,) = caplog.records  # once, with its traceback and the session
    assert logged.exc_info is not None and "chat_1" in logged.getMessage()
    assert recorder.turns == turns


async def test_an_engine_failure_is_told_and_recorded(monkeypatch: pytest.MonkeyPatch):
    result, messages, recorder = await serve(monkeypatch, "#fail:generate and more")
    assert result is False and [m["type"] for m in messages] == ["prefill_done", "chunk", "error"]
    assert messages[-1]["error"] == "inference failed: scripted failure in generate"
    assert recorder.turns == [("failed", messages[1]["text_delta"], "scripted failure in generate")]


@pytest.mark.parametrize("error", [asyncio.CancelledError(), RuntimeError("socket closed")])
async def test_a_client_gone_mid_answer_is_recorded_as_interrupted_and_not_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, error: BaseException
):
    with caplog.at_level(logging.ERROR, logger="omnilive"):
        result, messages, recorder = await serve(monkeypatch, "a b c d", 2, error)
    assert result is error and [m["type"] for m in messages] == ["prefill_done", "chunk"]
    assert recorder.turns == [("interrupted", messages[1]["text_delta"], None)]
    assert recorder.closed and not caplog.records  # the client left: not a failure


async def test_a_failure_is_recorded_even_when_its_error_cannot_be_sent(
    monkeypatch: pytest.MonkeyPatch,
):
    gone = RuntimeError("socket closed")
    result, messages, recorder = await serve(monkeypatch, "#fail:generate and more", 3, gone)
    assert result is gone and messages[-1]["type"] == "error"
    assert [status for status, _, _ in recorder.turns] == ["failed"] and recorder.closed

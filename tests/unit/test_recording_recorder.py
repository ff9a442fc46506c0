"""The recorder called directly: duplex units and turns on disk, crash safety,
opting out, and recovery of a recording whose writer died."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from omnilive.audio import tone
from omnilive.config import Settings
from omnilive.engines.messages import AudioPart, ChatMessage, ImagePart, TextPart, VideoPart
from omnilive.protocol.internal import Envelope
from omnilive.recording.duplex import DuplexRecorder
from omnilive.recording.files import new_recording_id
from omnilive.recording.recorder import Recorder
from omnilive.recording.recovery import RecordingIdNote, recover_abandoned
from omnilive.recording.turns import TurnInput, TurnOutput, TurnRecorder
from tests.recordings import jpeg, load, png, wav_seconds


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data")


@pytest.fixture
async def opened() -> AsyncIterator[list[Recorder]]:
    """Recorders a test opens; each is closed and its writer joined after it."""
    recorders: list[Recorder] = []
    yield recorders
    for recorder in recorders:
        await recorder.close()
        assert await recorder.wait_closed(30)


def duplex(settings: Settings, opened: list[Recorder], mode: str = "omni_duplex") -> DuplexRecorder:
    recorder = DuplexRecorder.open(
        settings,
        mode,
        new_recording_id(mode),
        worker_id="w3",
        config={"voice": "x"},  # type: ignore[arg-type]
    )
    assert recorder is not None
    opened.append(recorder)
    return recorder


async def record_units(recorder: DuplexRecorder, schedule: str) -> None:
    """One unit per second: ``L`` listens, ``S`` speaks for one second."""
    t0 = recorder.start_ts
    for index, plan in enumerate(schedule):
        speak = plan == "S"
        await recorder.unit(
            index,
            t0 + index,
            tone(1.0, 16_000, 440),
            [jpeg((200, 30, 30))],
            mode="SPEAK" if speak else "LISTEN",
            text=f"word {index}" if speak else "",
            ai_audio=tone(1.0, 24_000, 660) if speak else None,
            end_of_turn=speak and index == len(schedule) - 1,
            timing={"prefill_ms": 12.5, "generate_ms": 80.0},
            sent_ts=t0 + index + 0.2,
            dropped_before=1 if index == 1 else 0,
        )


async def test_duplex_units_are_written_with_the_reference_fields(settings, opened):
    recorder = duplex(settings, opened)
    await record_units(recorder, "LLS")
    await recorder.flush()
    directory = recorder.dir
    meta = load(directory / "meta.json")
    assert meta["status"] == "active" and meta["ended_at"] is None
    assert meta["session_id"] == recorder.recording_id and meta["app_type"] == "omni_duplex"
    assert meta["worker_id"] == "w3" and meta["config"] == {"voice": "x"}
    doc = load(directory / "recording.json")
    assert {"session_id", "mode", "worker_id", "start_ts", "config", "chunks"} <= set(doc)
    listen, dropped, speak = doc["chunks"]
    assert listen["index"] == 0 and listen["receive_ts_ms"] == 0.0
    assert listen["result"]["mode"] == "LISTEN" and listen["result"]["ai_audio"] is None
    assert dropped["dropped_before"] == 1
    assert speak["receive_ts_ms"] == 2000.0 and speak["user_audio"] == "user_audio/002.wav"
    assert speak["user_frame"] == "user_frames/002.jpg"
    result = speak["result"]
    assert result["mode"] == "SPEAK" and result["text"] == "word 2" and result["end_of_turn"]
    assert result["ai_audio"] == "ai_audio/002.wav" and result["ai_audio_duration_ms"] == 1000.0
    assert result["timing"] == {"prefill_ms": 12.5, "generate_ms": 80.0}
    assert result["sent_ts_ms"] == result["ai_audio_at_ms"] == 2200.0
    assert wav_seconds(directory / "user_audio/001.wav") == pytest.approx(1.0)
    assert wav_seconds(directory / "ai_audio/002.wav") == pytest.approx(1.0)
    assert (directory / "user_frames/000.jpg").read_bytes()[:3] == b"\xff\xd8\xff"

    await recorder.close()
    assert await recorder.wait_closed(30)
    meta = load(directory / "meta.json")
    assert meta["status"] == "ended" and meta["ended_at"] and meta["duration_s"] >= 0
    assert meta["counts"] == {"chunks": 3}
    assert set(meta["replays"]) == {"merged_replay.wav", "merged_replay.mp4", "subtitles.vtt"}


async def test_recording_json_is_valid_after_every_unit(settings, opened):
    recorder = duplex(settings, opened, "audio_duplex")
    t0 = recorder.start_ts
    for index in range(5):
        await recorder.unit(index, t0 + index, tone(1.0, 16_000, 300), mode="LISTEN")
        await recorder.flush()
        doc = json.loads((recorder.dir / "recording.json").read_bytes())
        assert [c["index"] for c in doc["chunks"]] == list(range(index + 1))
    leftovers = [p.name for p in recorder.dir.rglob(".*")]
    assert leftovers == [], "atomic writes leave no temporary files"


async def test_ai_audio_plays_back_to_back(settings, opened):
    """Audio sent while the previous unit still plays starts when it ends."""
    recorder = duplex(settings, opened, "audio_duplex")
    t0 = recorder.start_ts
    for index, sent in enumerate([1.0, 1.2, 5.0]):
        await recorder.unit(
            index, t0 + index, None, mode="SPEAK", text="x",
            ai_audio=tone(1.0, 24_000, 500), sent_ts=t0 + sent,
        )  # fmt: skip
    await recorder.flush()
    chunks = load(recorder.dir / "recording.json")["chunks"]
    assert [c["result"]["ai_audio_at_ms"] for c in chunks] == [1000.0, 2000.0, 5000.0]
    assert chunks[0]["user_audio"] is None


async def test_chat_turn_saves_every_medium(settings, opened):
    recorder = TurnRecorder.open(
        settings, "chat", new_recording_id("chat"), worker_id="w0", config={}, title="hi"
    )
    assert recorder is not None
    opened.append(recorder)
    image, video = png(), b"\x00\x00\x00\x18ftypmp42" + bytes(64)
    messages = [
        ChatMessage("system", (TextPart("be brief"),)),
        ChatMessage("user", (AudioPart(np.zeros(4000, np.float32)),)),  # history: not placed
        ChatMessage("assistant", (TextPart("ok"),)),
        ChatMessage(
            "user",
            (
                TextPart("look"),
                AudioPart(tone(0.5, 16_000, 440)),
                ImagePart(image),
                VideoPart(video, 2),
            ),
        ),
    ]
    output = TurnOutput()
    request_ts = recorder.start_ts + 2.0
    output.add("Hello ", tone(0.3, 24_000, 500), request_ts + 0.5)
    output.add("world", tone(0.2, 24_000, 500), request_ts + 0.6)
    await recorder.turn(request_ts, TurnInput(messages=messages), output, {"total_ms": 9.0})
    await recorder.flush()
    turn = load(recorder.dir / "recording.json")["turns"][0]
    assert turn["turn_index"] == 0 and turn["status"] == "done"
    assert turn["request_ts_ms"] == 2000.0 and turn["timing"] == {"total_ms": 9.0}
    history, last = turn["input"]["messages"][1], turn["input"]["messages"][3]
    assert history["content"][0] == {
        "type": "audio",
        "file": "user_audio/000.wav",
        "duration_ms": 250.0,
    }
    text, audio, img, vid = last["content"]
    assert text == {"type": "text", "text": "look"}
    assert audio["file"] == "user_audio/001.wav" and audio["duration_ms"] == 500.0
    assert audio["at_ms"] == 1500.0  # recorded before sending: it ends on arrival
    assert (
        img["file"] == "user_images/000.png" and (recorder.dir / img["file"]).read_bytes() == image
    )
    assert vid == {"type": "video", "file": "user_videos/000.mp4", "stack_frames": 2}
    output_doc = turn["output"]
    assert output_doc["text"] == "Hello world" and output_doc["audio"] == "ai_audio/000.wav"
    assert output_doc["audio_duration_ms"] == 500.0
    assert output_doc["audio_segments"] == [
        {"at_ms": 2500.0, "samples": 7200},
        {"at_ms": 2800.0, "samples": 4800},  # queued behind the first chunk
    ]
    assert wav_seconds(recorder.dir / "ai_audio/000.wav") == pytest.approx(0.5)


async def test_recording_off_or_opted_out_writes_nothing(settings, tmp_path):
    off = settings.model_copy(
        update={"recording": settings.recording.model_copy(update={"enabled": False})}
    )
    assert TurnRecorder.open(off, "chat", "chat_x", worker_id="w0", config={}) is None
    assert DuplexRecorder.open(off, "omni_duplex", "odx_x", worker_id="w0", config={}) is None
    assert (
        TurnRecorder.open(
            settings, "half_duplex", "hd_x", worker_id="w0", config={}, opted_in=False
        )
        is None
    )
    assert not (tmp_path / "data").exists()


def test_recording_ids_are_unguessable_and_unsafe_ones_refused(settings):
    ids = {new_recording_id("half_duplex") for _ in range(100)}
    assert len(ids) == 100 and all(i.startswith("hd_") and len(i) > 16 for i in ids)
    with pytest.raises(ValueError):
        TurnRecorder.open(settings, "chat", "../escape", worker_id="w0", config={})


async def test_recovery_of_a_recording_whose_writer_died(settings, opened):
    recorder = duplex(settings, opened)
    await record_units(recorder, "LSS")
    await recorder.flush()
    # What a SIGKILL leaves behind: the files as they are now, status active.
    crashed = recorder.dir.with_name("odx_crashed")
    shutil.copytree(recorder.dir, crashed)
    assert recover_abandoned(settings.data_dir, "odx_crashed")
    meta = load(crashed / "meta.json")
    assert meta["status"] == "abnormal" and meta["ended_at"] and meta["counts"] == {"chunks": 3}
    assert "merged_replay.wav" in meta["replays"] and (crashed / "merged_replay.wav").is_file()
    assert len(load(crashed / "recording.json")["chunks"]) == 3
    # Closed ones, missing ones and unsafe ids are left alone.
    assert not recover_abandoned(settings.data_dir, "odx_crashed")
    assert not recover_abandoned(settings.data_dir, "odx_missing")
    assert not recover_abandoned(settings.data_dir, "../../etc")


def test_the_gateway_notes_the_announced_recording_id():
    note = RecordingIdNote()
    note.note(Envelope.of({"type": "queue_done"}))
    assert note.recording_id is None
    note.note(Envelope.of({"type": "prepared", "session_id": "c", "recording_session_id": "hd_a1"}))
    assert note.recording_id == "hd_a1"
    note.note(Envelope.of({"type": "prepared", "recording_session_id": "hd_other"}))
    assert note.recording_id == "hd_a1", "the first announcement wins"
    unsafe = RecordingIdNote()
    unsafe.note(Envelope("prepared", recording_id="../../x"))
    assert unsafe.recording_id is None


def test_envelopes_carry_what_the_gateway_needs_and_the_message_untouched():
    message = {"type": "session.closed", "reason": "user_stop", "text": "a\nb", "x": [1]}
    envelope, payload = Envelope.split(Envelope.frame(message))
    assert envelope == Envelope("session.closed", reason="user_stop")
    assert json.loads(payload) == message and payload == json.dumps(message)
    error = Envelope.of({"type": "error", "error": {"code": "x", "message": "boom"}})
    assert error.error == "boom"
    assert Envelope.of({"type": "error", "error": "plain", "code": "c"}).error == "plain"

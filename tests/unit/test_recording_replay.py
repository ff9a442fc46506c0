"""Replays: the stereo WAV puts each side's audio at its real time; the MP4
shows each frame when it arrived, with the audio and subtitles."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from omnilive.config import Settings
from omnilive.recording import replay
from omnilive.recording.duplex import DuplexRecorder
from omnilive.recording.files import new_recording_id
from omnilive.recording.replay import REPLAY_RATE, subtitles
from omnilive.recording.timeline import Caption
from omnilive.recording.turns import TurnInput, TurnOutput, TurnRecorder
from tests.recordings import constant, ffprobe, frame_at, jpeg, load, stereo

RATE = REPLAY_RATE
EPS = 2e-4  # PCM16 quantisation


def settings_for(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data")


def assert_span(channel: np.ndarray, start: int, length: int, value: float) -> None:
    """``value`` exactly over [start, start + length), silence just outside."""
    assert abs(channel[start - 1]) < EPS, "starts no earlier"
    assert np.all(np.abs(channel[start : start + length] - value) < EPS)
    end = start + length
    assert end == channel.size or abs(channel[end]) < EPS, "ends no later"


@pytest.mark.parametrize("block", [replay.BLOCK_SAMPLES, 7_000])  # clips across blocks too
async def test_stereo_replay_places_user_left_and_ai_right_on_the_timeline(
    tmp_path, monkeypatch, block
):
    monkeypatch.setattr(replay, "BLOCK_SAMPLES", block)
    recorder = DuplexRecorder.open(
        settings_for(tmp_path), "audio_duplex", new_recording_id("audio_duplex"),
        worker_id="w0", config={},
    )  # fmt: skip
    assert recorder is not None
    t0 = recorder.start_ts
    await recorder.unit(0, t0 + 1.0, constant(0.5, 16_000, 0.5), mode="LISTEN", sent_ts=t0 + 1.1)
    await recorder.unit(
        1, t0 + 2.0, constant(0.5, 16_000, 0.5), mode="SPEAK", text="hi",
        ai_audio=constant(0.4, 24_000, 0.25), sent_ts=t0 + 2.3,
    )  # fmt: skip
    await recorder.unit(
        2, t0 + 3.0, None, mode="SPEAK", text="there",
        ai_audio=constant(0.2, 24_000, -0.5), sent_ts=t0 + 3.5,
    )  # fmt: skip
    await recorder.close()
    assert await recorder.wait_closed(30)
    mix, rate = stereo(recorder.dir / "merged_replay.wav")
    user, ai = mix[:, 0], mix[:, 1]
    assert rate == RATE and mix.shape[0] == round(3.7 * RATE)  # up to the end of the last clip
    assert_span(user, 1 * RATE, RATE // 2, 0.5)
    assert_span(user, 2 * RATE, RATE // 2, 0.5)
    assert_span(ai, round(2.3 * RATE), round(0.4 * RATE), 0.25)
    assert_span(ai, round(3.5 * RATE), round(0.2 * RATE), -0.5)
    assert np.all(np.abs(user[round(2.6 * RATE) :]) < EPS), "no AI audio on the user's side"
    assert np.all(np.abs(ai[: round(2.3 * RATE)]) < EPS), "no user audio on the AI's side"


async def test_turn_replay_starts_with_audio_recorded_before_the_request(tmp_path):
    recorder = TurnRecorder.open(
        settings_for(tmp_path), "half_duplex", "hd_replay", worker_id="w0", config={}
    )
    assert recorder is not None
    t0 = recorder.start_ts
    output = TurnOutput()
    output.add("a", constant(0.5, 24_000, 0.25), t0 + 0.7)
    output.add("b", constant(0.5, 24_000, -0.25), t0 + 0.8)  # queued behind the first
    speech = TurnInput(speech=constant(0.5, 16_000, 0.5), speech_ts=t0 - 0.3)
    await recorder.turn(t0 + 0.2, speech, output, {"total_ms": 1.0})
    await recorder.close()
    assert await recorder.wait_closed(30)
    assert load(recorder.dir / "recording.json")["turns"][0]["input"]["user_audio_at_ms"] == -300.0
    mix, _ = stereo(recorder.dir / "merged_replay.wav")
    # Time 0 of the replay is the earliest sound, 300 ms before the recording began.
    assert np.all(np.abs(mix[: RATE // 2, 0] - 0.5) < EPS)
    ai = mix[:, 1]
    assert abs(ai[RATE - 1]) < EPS and ai.size == 2 * RATE
    assert np.all(np.abs(ai[RATE : round(1.5 * RATE)] - 0.25) < EPS)
    assert np.all(np.abs(ai[round(1.5 * RATE) : 2 * RATE] + 0.25) < EPS)


async def test_omni_replay_video_shows_each_frame_with_audio_and_subtitles(tmp_path):
    recorder = DuplexRecorder.open(
        settings_for(tmp_path), "omni_duplex", new_recording_id("omni_duplex"),
        worker_id="w0", config={},
    )  # fmt: skip
    assert recorder is not None
    t0 = recorder.start_ts
    colors = [(220, 20, 20), (20, 220, 20), (20, 20, 220)]
    for index, color in enumerate(colors):
        speak = index == 1
        await recorder.unit(
            index, t0 + index, constant(1.0, 16_000, 0.1), [jpeg(color)],
            mode="SPEAK" if speak else "LISTEN", text="hello there" if speak else "",
            ai_audio=constant(1.0, 24_000, 0.2) if speak else None, sent_ts=t0 + index + 0.1,
        )  # fmt: skip
    await recorder.close()
    assert await recorder.wait_closed(60)
    video = recorder.dir / "merged_replay.mp4"
    probe = ffprobe(video)
    kinds = {s["codec_type"]: float(s.get("duration", 0)) for s in probe["streams"]}
    assert set(kinds) == {"video", "audio", "subtitle"}
    assert kinds["video"] == pytest.approx(3.0, abs=0.25)
    assert kinds["audio"] == pytest.approx(3.0, abs=0.1)
    for seconds, color in zip([0.5, 1.5, 2.5], colors, strict=True):
        pixel = frame_at(video, seconds)
        assert np.argmax(pixel) == np.argmax(color), (seconds, pixel)
    vtt = (recorder.dir / "subtitles.vtt").read_text()
    assert vtt.startswith("WEBVTT") and "00:00:01.100 --> 00:00:02.100\nhello there" in vtt


async def test_audio_only_sessions_get_no_video(tmp_path):
    recorder = DuplexRecorder.open(
        settings_for(tmp_path), "audio_duplex", "adx_novideo", worker_id="w0", config={}
    )
    assert recorder is not None
    await recorder.unit(0, recorder.start_ts, constant(1.0, 16_000, 0.1), mode="LISTEN")
    await recorder.close()
    assert await recorder.wait_closed(30)
    assert load(recorder.dir / "meta.json")["replays"] == ["merged_replay.wav"]


def test_subtitles_end_before_the_next_one_starts():
    captions = [Caption(0, 5000, "one"), Caption(1500, 2500, "two --> x")]
    assert subtitles(captions, -500.0, "srt") == (
        "1\n00:00:00,500 --> 00:00:02,000\none\n\n2\n00:00:02,000 --> 00:00:03,000\ntwo -> x\n"
    )

"""The transport's audio plumbing without a peer: Opus-rate frames to the
protocol's chunks, and the answer track's bounded, flushable buffer."""

from __future__ import annotations

import fractions

import av
import numpy as np
from aiortc.rtp import RtpPacket

from omnilive.gateway.webrtc.media import (
    OPUS_RATE,
    PACKET_SAMPLES,
    AnswerAudio,
    AnswerTrack,
    InOrderAudio,
    InputAudio,
    jpeg_of,
)


def opus_frame(value: float, pts: int) -> av.AudioFrame:
    """A 20 ms stereo frame as aiortc's Opus decoder hands it over."""
    pcm = np.full((1, PACKET_SAMPLES * 2), int(value * 32767), np.int16)
    frame = av.AudioFrame.from_ndarray(pcm, format="s16", layout="stereo")
    frame.sample_rate, frame.pts = OPUS_RATE, pts
    frame.time_base = fractions.Fraction(1, OPUS_RATE)
    return frame


def test_frames_become_whole_chunks_at_the_protocol_rate():
    audio = InputAudio(16_000, 0.1)
    frames = [opus_frame(0.25, i * PACKET_SAMPLES) for i in range(12)]  # 240 ms
    chunks = audio.convert(frames[:7]) + audio.convert(frames[7:])
    assert [c.size for c in chunks] == [1600, 1600]  # 40 ms wait for the next frames
    assert chunks[1].dtype == np.float32 and abs(float(chunks[1][800]) - 0.25) < 0.01


def test_answer_audio_is_resampled_for_opus_as_one_stream():
    answer = AnswerAudio(24_000)
    tone = np.sin(np.arange(24_000) * 2 * np.pi * 440 / 24_000).astype(np.float32) * 0.5
    pieces = [answer.convert(tone[i : i + 2400]) for i in range(0, tone.size, 2400)]
    pcm = np.concatenate(pieces)
    assert pcm.dtype == np.int16 and abs(pcm.size - 48_000) <= 64
    # No seam between pieces: the 440 Hz tone stays smooth (no step over ~2 samples' rise).
    steps = np.abs(np.diff(pcm[2000:-2000].astype(np.int32)))
    assert steps.max() < 0.5 * 32767 * 2 * np.pi * 440 / 48_000 * 1.5


def test_the_answer_track_is_bounded_and_flushes():
    playing: list[bool] = []
    track = AnswerTrack(max_s=0.1, on_playing=playing.append)
    for _ in range(10):
        track.push(np.ones(PACKET_SAMPLES, np.int16))  # 200 ms into a 100 ms buffer
    assert track.queued_s == 0.1 and track.dropped_samples == 5 * PACKET_SAMPLES
    assert track._take(PACKET_SAMPLES)[0] == 1 and playing == [True]
    track.flush()
    assert track.queued_s == 0 and track._take(PACKET_SAMPLES).max() == 0
    assert playing == [True, False]


def test_each_audio_packet_is_decoded_as_it_comes_and_a_late_one_is_dropped():
    buffer = InOrderAudio(16)

    def arrives(seq: int) -> bytes | None:
        packet = RtpPacket(payload=bytes([seq % 256]), sequence_number=seq, timestamp=960 * seq)
        packet._data = packet.payload  # as the receiver depayloads it
        _, frame = buffer.add(packet)
        return frame.data if frame is not None else None

    assert arrives(65534) == bytes([254])  # at once: no waiting for the next packet
    assert arrives(65535) == bytes([255])
    assert arrives(1) == bytes([1])  # across the wrap; 0 was lost: a gap
    assert arrives(0) is None  # it came after 1: too late
    assert arrives(2) == bytes([2])


def test_a_camera_frame_becomes_a_jpeg_no_larger_than_asked():
    import io

    from PIL import Image

    frame = av.VideoFrame.from_ndarray(np.full((720, 1280, 3), 128, np.uint8), format="rgb24")
    for side, size in ((640, (640, 360)), (1280, (1280, 720)), (2000, (1280, 720))):
        assert Image.open(io.BytesIO(jpeg_of(frame, side))).size == size

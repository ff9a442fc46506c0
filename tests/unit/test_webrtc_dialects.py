"""What a WebRTC call changes in each protocol, socket-free: the track's
audio as the protocol's own messages, answer audio taken out of the events,
barge-in flushes, and audio held until a session is prepared."""

from __future__ import annotations

import base64
import json

import numpy as np

from omnilive.audio import pcm_from_b64, pcm_to_b64
from omnilive.gateway.webrtc.dialects import (
    FRAME_MAX_SIDE,
    HD_FRAME_MAX_SIDE,
    Dialect,
    MediaDialect,
)


def test_openai_audio_in_is_24khz_pcm16():
    dialect = MediaDialect(Dialect.OPENAI)
    assert dialect.takes_audio and dialect.input_rate == 24_000
    message = json.loads(dialect.audio_message(np.full(2400, 0.5, np.float32)))
    assert message["type"] == "input_audio_buffer.append"
    pcm = np.frombuffer(base64.b64decode(message["audio"]), "<i2")
    assert pcm.size == 2400 and pcm[0] == 16383


def test_openai_audio_out_leaves_the_channel():
    dialect = MediaDialect(Dialect.OPENAI)
    delta = base64.b64encode((np.ones(480) * 1000).astype("<i2").tobytes()).decode()
    out = dialect.outbound(json.dumps({"type": "response.output_audio.delta", "delta": delta}))
    assert out.event is None and out.audio is not None and out.audio.size == 480
    barge = dialect.outbound(json.dumps({"type": "input_audio_buffer.speech_started"}))
    assert barge.flush and barge.event is not None
    text = dialect.outbound(json.dumps({"type": "response.output_text.delta", "delta": "hi"}))
    assert not text.flush and text.audio is None and json.loads(text.event)["delta"] == "hi"


def test_audio_on_the_channel_is_dropped():
    dialect = MediaDialect(Dialect.OPENAI)
    assert dialect.client_event('{"type": "input_audio_buffer.append", "audio": ""}') is None
    assert dialect.client_event('{"type": "response.create"}') == '{"type": "response.create"}'
    assert dialect.client_event("not json") == "not json"  # the session refuses it its way


def test_duplex_waits_for_prepared_and_pauses():
    dialect = MediaDialect(Dialect.DUPLEX)
    assert not dialect.takes_audio and dialect.chunk_s == 1.0
    dialect.outbound(json.dumps({"type": "prepared", "session_id": "x"}))
    assert dialect.takes_audio
    dialect.outbound('{"type": "paused", "timeout_s": 60}')
    assert not dialect.takes_audio
    dialect.outbound('{"type": "resumed"}')
    assert dialect.takes_audio


def test_a_call_that_resumes_a_session_takes_audio_at_once():
    """Its session was prepared on the call it lost: no "prepared" comes again."""
    for kind in (Dialect.DUPLEX, Dialect.HALF_DUPLEX):
        dialect = MediaDialect(kind)
        assert not dialect.takes_audio
        dialect.outbound(json.dumps({"type": "session.resumed", "session_id": "x"}))
        assert dialect.takes_audio


def test_duplex_results_lose_their_audio_and_chunks_carry_a_frame():
    dialect = MediaDialect(Dialect.DUPLEX)
    samples = np.linspace(-1, 1, 240, dtype=np.float32)
    out = dialect.outbound(
        json.dumps({"type": "result", "text": "a", "audio_data": pcm_to_b64(samples)})
    )
    assert np.allclose(out.audio, samples)
    assert json.loads(out.event) == {"type": "result", "text": "a", "audio_data": None}
    chunk = json.loads(dialect.audio_message(np.zeros(16_000, np.float32), b"\xff\xd8jpeg"))
    assert pcm_from_b64(chunk["audio_base64"]).size == 16_000
    assert base64.b64decode(chunk["frame_base64_list"][0]) == b"\xff\xd8jpeg"


def test_half_duplex_chunks():
    dialect = MediaDialect(Dialect.HALF_DUPLEX)
    listen = dialect.outbound('{"type": "chunk", "text_delta": "x", "audio_data": null}')
    assert listen.audio is None and json.loads(listen.event)["text_delta"] == "x"


def test_half_duplex_speech_over_the_answer_flushes_it_and_duplex_never_does():
    half = MediaDialect(Dialect.HALF_DUPLEX)
    assert half.outbound('{"type": "interrupted", "turn_index": 0}').flush
    assert half.outbound('{"type": "vad_state", "speaking": true}').flush
    assert not half.outbound('{"type": "vad_state", "speaking": false}').flush
    assert not half.outbound('{"type": "generating", "speech_duration_ms": 900}').flush
    duplex = MediaDialect(Dialect.DUPLEX)
    assert not duplex.outbound('{"type": "vad_state", "speaking": true}').flush


def test_force_listen_marks_the_next_duplex_chunk():
    dialect = MediaDialect(Dialect.DUPLEX)
    marker = '{"type": "audio_chunk", "audio_base64": "", "force_listen": true}'
    assert dialect.client_event(marker) is None
    first = json.loads(dialect.audio_message(np.zeros(16_000, np.float32)))
    second = json.loads(dialect.audio_message(np.zeros(16_000, np.float32)))
    assert first["force_listen"] is True and "force_listen" not in second


def test_a_prepare_for_more_than_one_slice_takes_frames_at_hd_size():
    """As the omni page grabs frames over the WebSocket: 640 px, or 1280 px
    when it asks for two slices (its HD)."""
    dialect = MediaDialect(Dialect.DUPLEX)
    assert dialect.frame_max_side == FRAME_MAX_SIDE
    prepare = {"type": "prepare", "mode": "omni_duplex"}
    for slices, side in ((2, HD_FRAME_MAX_SIDE), (1, FRAME_MAX_SIDE), (9, HD_FRAME_MAX_SIDE)):
        assert dialect.client_event(json.dumps({**prepare, "max_slice_nums": slices})) is not None
        assert dialect.frame_max_side == side
    for odd in (None, "4", True, 2.5):  # the session answers these; the size stays plain
        dialect.client_event(json.dumps({**prepare, "max_slice_nums": odd}))
        assert dialect.frame_max_side == FRAME_MAX_SIDE


def test_a_live_call_takes_audio_once_started_as_24khz_pcm16():
    dialect = MediaDialect(Dialect.LIVE)
    assert not dialect.takes_audio and dialect.input_rate == 24_000
    dialect.outbound(json.dumps({"type": "session.input_audio.muted"}))
    assert not dialect.takes_audio
    dialect.outbound(json.dumps({"type": "session.started", "session": {}}))
    assert dialect.takes_audio
    message = json.loads(dialect.audio_message(np.full(2400, 0.5, np.float32)))
    assert message["type"] == "session.input_audio.append"
    assert np.frombuffer(base64.b64decode(message["audio"]), "<i2")[0] == 16383
    # Sent on the channel it would be heard twice: the track's alone counts.
    appended = {"type": "session.input_audio.append", "audio": message["audio"]}
    assert dialect.client_event(json.dumps(appended)) is None


def test_live_audio_out_leaves_the_channel_and_nothing_flushes_it():
    dialect = MediaDialect(Dialect.LIVE)
    delta = base64.b64encode((np.ones(480) * 1000).astype("<i2").tobytes()).decode()
    out = dialect.outbound(json.dumps({"type": "session.output_audio.delta", "delta": delta}))
    assert out.event is None and out.audio is not None and out.audio.size == 480
    said = {"type": "session.output_transcript.delta", "delta": "hi", "start_ms": 0, "end_ms": 1}
    text = dialect.outbound(json.dumps(said))
    assert not text.flush and text.audio is None and json.loads(text.event or "")["delta"] == "hi"
    heard = dialect.outbound(json.dumps({**said, "type": "session.input_transcript.delta"}))
    assert not heard.flush  # full duplex: the model itself decides to stop for the user

"""What a worker's session runner takes of an ``audio_chunk`` in either form
(worker/chunk_media.py), socket-free: the client's text, or the media frame
the gateway makes of it, give the same samples and frames, or the same
refusal, word for word."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import pytest

from omnilive.config import LimitSettings
from omnilive.gateway.sessions import binary_media
from omnilive.protocol import duplex, half_duplex
from omnilive.protocol.common import ErrorCode, ProtocolError, decode_client_message
from omnilive.protocol.media_frame import MAGIC, MediaMessage, encode_media
from omnilive.worker.chunk_media import DecodedChunk, chunk_audio, chunk_frames, read_frame

MAX_BYTES = 1 << 24
LIMITS = LimitSettings(max_frames_per_chunk=2, max_frame_bytes=64)
SECOND = np.linspace(-0.5, 0.5, 16_000, dtype="<f4")
FRAME = b"\xff\xd8" + b"j" * 30


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def both_forms(protocol: Any, message: dict[str, Any]) -> list[Any]:
    """The chunk as the worker reads it from the client's text and from what
    the gateway sends (the first the text, the second a media frame where
    the gateway makes one)."""
    text = json.dumps(message)
    typed = decode_client_message(text, protocol.client_message, protocol.CLIENT_TYPES, MAX_BYTES)
    sent = binary_media(text, typed)
    return [
        read_frame(raw, protocol.client_message, protocol.CLIENT_TYPES, MAX_BYTES,
                   protocol.ChunkFields)
        for raw in (text, sent)
    ]  # fmt: skip


def outcome(work: Any) -> Any:
    try:
        value = work()
    except ProtocolError as exc:
        return (exc.code, exc.message)
    if isinstance(value, np.ndarray):
        return ("samples", value.dtype.str, value.tobytes())
    return value


def test_a_chunk_reads_the_same_either_way():
    audio = b64(SECOND.tobytes())
    message = {"type": "audio_chunk", "audio_base64": audio, "frame_base64_list": [b64(FRAME)],
               "force_listen": True, "input_id": "i"}  # fmt: skip
    text, binary = both_forms(duplex, message)
    assert isinstance(text, duplex.AudioChunk) and isinstance(binary, DecodedChunk)
    assert binary.fields == duplex.ChunkFields(type="audio_chunk", force_listen=True, input_id="i")
    assert outcome(lambda: chunk_audio(text)) == outcome(lambda: chunk_audio(binary))
    np.testing.assert_array_equal(chunk_audio(binary), SECOND)
    assert chunk_frames(text, LIMITS) == chunk_frames(binary, LIMITS) == [FRAME]
    for form in both_forms(duplex, {**message, "frame_base64_list": None}):
        assert chunk_frames(form, LIMITS) == []


def test_a_half_duplex_chunk_reads_the_same_either_way():
    message = {"type": "audio_chunk", "audio_base64": b64(SECOND[:800].tobytes())}
    text, binary = both_forms(half_duplex, message)
    assert isinstance(binary, DecodedChunk)
    assert binary.fields == half_duplex.ChunkFields(type="audio_chunk")
    assert outcome(lambda: chunk_audio(text)) == outcome(lambda: chunk_audio(binary))


NAN = np.array([0.0, np.nan], "<f4").tobytes()


@pytest.mark.parametrize(
    ("fields", "code", "words"),
    [
        ({"audio_base64": b64(NAN)}, ErrorCode.INVALID_REQUEST,
         "audio_base64: PCM contains NaN or infinite samples"),
        ({"audio_base64": "&" * 16}, ErrorCode.INVALID_REQUEST, "audio_base64: invalid base64: "),
        ({"frame_base64_list": [b64(FRAME)] * 3}, ErrorCode.PAYLOAD_TOO_LARGE,
         "3 frames exceed 2 per chunk"),
        ({"frame_base64_list": [b64(FRAME), b64(FRAME * 3)]}, ErrorCode.PAYLOAD_TOO_LARGE,
         "frame 1 of 96 bytes exceeds 64"),
        ({"frame_base64_list": [b64(FRAME), "!!!!"]}, ErrorCode.INVALID_REQUEST,
         "frame 1: invalid base64: "),
    ],
    ids=["nan", "audio-base64", "frame-count", "frame-size", "frame-base64"],
)  # fmt: skip
def test_a_bad_chunk_is_refused_in_the_same_words_either_way(
    fields: dict[str, Any], code: ErrorCode, words: str
):
    message = {"type": "audio_chunk", "audio_base64": b64(SECOND.tobytes()), **fields}
    forms = both_forms(duplex, message)

    def refusals(form: Any) -> Any:
        return outcome(lambda: (chunk_audio(form), chunk_frames(form, LIMITS)))

    text, sent = (refusals(form) for form in forms)
    assert text == sent
    assert text[0] is code and text[1].startswith(words), text


def test_a_media_frame_that_is_not_one_is_refused_as_invalid_request():
    def refused(raw: bytes) -> tuple[ErrorCode, str]:
        adapter, types = duplex.worker_message, duplex.WORKER_TYPES
        with pytest.raises(ProtocolError) as caught:
            read_frame(raw, adapter, types, MAX_BYTES, duplex.ChunkFields)
        return caught.value.code, caught.value.message

    assert refused(MAGIC + b"\x00") == (
        ErrorCode.INVALID_REQUEST,
        "media frame: truncated: 5 bytes, the prefix takes 8",
    )
    stop = encode_media(MediaMessage({"type": "stop"}, b""))
    assert refused(stop)[0] is ErrorCode.INVALID_REQUEST  # only an audio_chunk comes so
    bad = encode_media(MediaMessage({"type": "audio_chunk", "max_slice_nums": 10}, b""))
    assert refused(bad) == (
        ErrorCode.INVALID_REQUEST,
        "max_slice_nums: Input should be less than or equal to 9",
    )
    # A client's JSON sent as a binary frame is still the client's message.
    raw = json.dumps({"type": "stop"}).encode()
    assert isinstance(
        read_frame(raw, duplex.worker_message, duplex.WORKER_TYPES, MAX_BYTES, duplex.ChunkFields),
        duplex.Stop,
    )

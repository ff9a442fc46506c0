"""Hypothesis strategies for client frames of every protocol, and the codes a
server may answer them with. Shared by the fuzz tests and
``benchmarks/fuzz_nightly.py``.

A frame is mostly a message of the protocol with each field either plausible
(valid base64 audio, a real JPEG, numbers at the bounds) or junk (any JSON
value), so that generation reaches the deep checks; the rest is any JSON,
text that is not JSON, and binary.
"""

from __future__ import annotations

import base64
import io
import json
from typing import Any

from hypothesis import strategies as st
from PIL import Image

from omnilive.protocol.common import ErrorCode
from omnilive.protocol.media_frame import MAGIC, MediaMessage, encode_media
from omnilive.protocol.realtime import RealtimeErrorCode

DOCUMENTED_CODES = frozenset(c.value for c in ErrorCode)
REALTIME_CODES = frozenset(c.value for c in RealtimeErrorCode)


def _jpeg(size: tuple[int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, (20, 120, 200)).save(buffer, "JPEG")
    return buffer.getvalue()


JPEGS = (_jpeg((8, 8)), _jpeg((64, 48)))
WAV_HEADER = b"RIFF\x24\x00\x00\x00WAVEfmt "

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**64), max_value=2**64)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=24)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=6,
)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


pcm_b64 = st.integers(min_value=0, max_value=6000).map(lambda n: _b64(b"\x00\x00\x80\x3c" * n))
junk_b64 = st.one_of(
    st.binary(max_size=64).map(_b64),  # valid base64 of bytes that are not float32
    st.text(alphabet="ABCabc+/=-_!* \n", max_size=40),  # often not base64 at all
    st.sampled_from(["", "====", "AAA", "AAAA=", "////", "\u00e9\u00e9"]),
)
audio = st.one_of(pcm_b64, pcm_b64, junk_b64, json_values)
frame = st.one_of(
    st.sampled_from(JPEGS).map(_b64),
    st.binary(max_size=64).map(lambda b: _b64(b"\xff\xd8\xff" + b)),  # broken JPEG
    junk_b64,
    json_values,
)
frames = st.one_of(st.lists(frame, max_size=4), json_values)
numbers = st.one_of(
    st.sampled_from([0, 1, -1, 9, 10, 0.5, 1e9, -1e9, 1e308, 65]),
    st.floats(allow_nan=False, allow_infinity=True),
    json_values,
)
texts = st.one_of(st.text(max_size=40), json_values)
voice_id = st.one_of(st.sampled_from(["v1", "../etc/passwd", "a/b", "", "x" * 200]), texts)
wav = st.one_of(st.binary(max_size=64).map(lambda b: _b64(WAV_HEADER + b)), junk_b64, audio)


def message(kind: Any, **fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A message of type ``kind`` with any subset of ``fields``."""
    return st.fixed_dictionaries({"type": kind}, optional=fields)


def _typed(types: list[str]) -> st.SearchStrategy[Any]:
    return st.one_of(st.sampled_from(types), st.sampled_from(types), json_values)


def frames_of(messages: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[str | bytes]:
    """Messages as JSON text, mostly; else any JSON, text, or binary."""
    as_text = messages.map(lambda m: json.dumps(m))
    return st.one_of(
        as_text,
        as_text,
        as_text,
        as_text,
        json_values.map(json.dumps),
        st.text(max_size=60),
        st.binary(max_size=60),
        as_text.map(lambda t: t.encode()),
    )


# --- chat (spec/chat.md) ---------------------------------------------------------------

content_item = st.one_of(
    message(st.just("text"), text=texts),
    message(st.just("image"), data=frame),
    message(st.just("audio"), data=audio, sample_rate=numbers),
    message(st.just("video"), data=frame, stack_frames=numbers),
    message(json_values, data=audio),
)
chat_message = st.fixed_dictionaries(
    {},
    optional={
        "role": st.one_of(st.sampled_from(["system", "user", "assistant"]), json_values),
        "content": st.one_of(st.text(max_size=40), st.lists(content_item, max_size=3), json_values),
    },
)
chat_request = st.fixed_dictionaries(
    {"messages": st.one_of(st.lists(chat_message, min_size=1, max_size=3), json_values)},
    optional={
        "streaming": st.one_of(st.booleans(), json_values),
        "generation": st.fixed_dictionaries(
            {}, optional={k: numbers for k in ("max_new_tokens", "temperature", "top_p")}
        ),
        "tts": st.fixed_dictionaries(
            {},
            optional={
                "enabled": st.one_of(st.booleans(), json_values),
                "mode": texts,
                "ref_audio_path": texts,
                "ref_audio_data": audio,
                "ref_audio_id": voice_id,
            },
        ),
        "image": st.fixed_dictionaries({}, optional={"max_slice_nums": numbers}),
        "omni_mode": json_values,
        "recording": st.one_of(st.booleans(), json_values),
    },
)
chat_frames = frames_of(chat_request)

# --- half-duplex ------------------------------------------------------------------------

hd_config = st.fixed_dictionaries(
    {},
    optional={
        "vad": st.fixed_dictionaries(
            {}, optional={k: numbers for k in ("threshold", "min_silence_duration_ms")}
        ),
        "session": st.fixed_dictionaries({}, optional={"timeout_s": numbers}),
        "generation": st.fixed_dictionaries({}, optional={"max_new_tokens": numbers}),
    },
)
half_duplex_message = st.one_of(
    message(
        _typed(["prepare"]),
        system_prompt=texts,
        system_content=st.one_of(
            st.lists(
                st.one_of(
                    message(st.just("text"), text=texts), message(st.just("audio"), data=audio)
                ),
                max_size=3,
            ),
            json_values,
        ),
        config=st.one_of(hd_config, json_values),
        ref_audio_base64=audio,
        ref_audio_id=voice_id,
        recording=json_values,
    ),
    message(_typed(["audio_chunk"]), audio_base64=audio),
    message(_typed(["stop", "audio_chunk", "prepare"])),
)
half_duplex_frames = frames_of(half_duplex_message)

# --- duplex -------------------------------------------------------------------------------

duplex_message = st.one_of(
    message(
        _typed(["prepare"]),
        system_prompt=texts,
        config=json_values,
        ref_audio_base64=audio,
        tts_ref_audio_base64=audio,
        ref_audio_id=voice_id,
        ref_audio_path=texts,
        deferred_finalize=json_values,
        max_slice_nums=numbers,
        mode=st.one_of(st.sampled_from(["audio", "omni", "video", "audio_duplex", "x"]), texts),
        dialect=st.one_of(st.sampled_from(["duplex", "realtime"]), texts),
        context_limit=numbers,
        ref_audio_format=st.one_of(st.sampled_from(["pcm_f32", "wav"]), texts),
    ),
    message(
        _typed(["audio_chunk"]),
        audio_base64=audio,
        frame_base64_list=frames,
        force_listen=json_values,
        max_slice_nums=numbers,
    ),
    message(_typed(["pause"]), timeout=numbers),
    message(_typed(["resume", "stop", "pause"])),
)
duplex_frames = frames_of(duplex_message)

# --- the gateway's media frames (protocol/media_frame.py), as a worker reads them ---------

_header_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats(allow_nan=False,
    allow_infinity=False) | st.text(max_size=24),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=3),
    max_leaves=4,
)  # fmt: skip
_media = st.builds(
    MediaMessage,
    message(
        st.one_of(st.just("audio_chunk"), st.just("audio_chunk"), st.text(max_size=12)),
        force_listen=_header_values,
        max_slice_nums=st.one_of(st.integers(-1, 12), _header_values),
        input_id=st.one_of(st.text(max_size=300), _header_values),
    ),
    st.one_of(  # float32 PCM, NaN among it, or any bytes
        st.integers(0, 6000).map(lambda n: b"\x00\x00\x80\x3c" * n),
        st.just(b"\x00\x00\xc0\x7f" * 4),
        st.binary(max_size=64),
    ),
    st.none() | st.lists(st.sampled_from(JPEGS) | st.binary(max_size=64), max_size=10).map(tuple),
).map(encode_media)
media_frames = st.one_of(
    _media,
    _media,
    st.tuples(_media, st.integers(0, 200)).map(lambda cut: cut[0][: cut[1]]),
    st.binary(max_size=60).map(lambda tail: MAGIC + tail),
)

# --- the Realtime API --------------------------------------------------------------------

realtime_event = st.one_of(
    message(
        _typed(["session.update"]),
        session=st.one_of(
            st.fixed_dictionaries(
                {},
                optional={
                    "instructions": texts,
                    "max_slice_nums": numbers,
                    "ref_audio": wav,
                    "tts_ref_audio": wav,
                    "ref_audio_id": voice_id,
                    "recording": json_values,
                },
            ),
            json_values,
        ),
    ),
    message(
        _typed(["input_audio_buffer.append"]),
        audio=audio,
        video_frames=frames,
        force_listen=json_values,
        max_slice_nums=numbers,
    ),
    message(_typed(["session.close", "session.init", "input.append"]), reason=texts),
)
realtime_frames = frames_of(realtime_event)

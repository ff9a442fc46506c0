"""The binary form of an ``audio_chunk`` (protocol/media_frame.py), socket-free:
round trips, what the gateway turns into it and what it leaves as text, and
a decoder that accepts or refuses every byte string with a documented reason."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from omnilive.gateway.sessions import as_sent, binary_media
from omnilive.protocol import duplex, half_duplex
from omnilive.protocol.common import decode_client_message
from omnilive.protocol.media_frame import (
    MAGIC,
    MAX_HEADER_BYTES,
    MediaFrameError,
    MediaMessage,
    decode_media,
    encode_media,
    is_media_frame,
    media_message,
)

# The reasons the module's docstring documents, as each message begins.
REASONS = (
    "not a media frame",
    "truncated: ",
    "header of ",
    "header: ",
    "header has no type",
    "audio_base64 ",
    "frame_base64_list ",
    "the header counts ",
)
SECOND = np.linspace(-0.5, 0.5, 16_000, dtype="<f4").tobytes()
JPEG = b"\xff\xd8\xff\xe0" + bytes(range(256)) * 4 + b"\xff\xd9"


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def typed(protocol, message: dict):
    return decode_client_message(
        json.dumps(message), protocol.client_message, protocol.CLIENT_TYPES, 1 << 24
    )


def refusal(raw: bytes) -> str:
    with pytest.raises(MediaFrameError) as caught:
        decode_media(raw)
    return str(caught.value)


def frame(header: object, media: bytes = b"") -> bytes:
    text = json.dumps(header).encode()
    return MAGIC + len(text).to_bytes(4, "big") + text + media


# --- round trips --------------------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        MediaMessage({"type": "audio_chunk"}, SECOND),
        MediaMessage({"type": "audio_chunk"}, b""),
        MediaMessage({"type": "audio_chunk", "force_listen": True}, SECOND, (JPEG,)),
        MediaMessage({"type": "audio_chunk", "input_id": "in_1"}, SECOND, (JPEG, b"", JPEG)),
        MediaMessage({"type": "audio_chunk"}, SECOND, ()),
    ],
    ids=["audio", "empty", "one-frame", "three-frames", "no-frames"],
)
def test_what_is_encoded_decodes_to_itself(message: MediaMessage):
    raw = encode_media(message)
    assert is_media_frame(raw) and decode_media(raw) == message
    # The media is carried as it is: its length, not base64, in the header.
    assert len(raw) < len(b64(message.audio)) or not message.audio


@given(
    fields=st.dictionaries(
        st.text(max_size=8).filter(lambda k: k not in ("type", "audio_base64")),
        st.none() | st.booleans() | st.integers() | st.text(max_size=16),
        max_size=4,
    ),
    kind=st.text(max_size=12),
    audio=st.binary(max_size=256),
    frames=st.none() | st.lists(st.binary(max_size=64), max_size=4),
)
def test_any_fields_and_bytes_come_back_as_they_were(fields, kind, audio, frames):
    fields.pop("frame_base64_list", None)
    message = MediaMessage(
        {**fields, "type": kind}, audio, None if frames is None else tuple(frames)
    )
    assert decode_media(encode_media(message)) == message


def test_what_cannot_be_a_media_frame_is_not_encoded():
    with pytest.raises(ValueError, match="string type"):
        encode_media(MediaMessage({}, b""))
    with pytest.raises(ValueError, match="media field"):
        encode_media(MediaMessage({"type": "audio_chunk", "audio_base64": "AAAA"}, b""))
    with pytest.raises(ValueError, match="exceeds"):
        encode_media(MediaMessage({"type": "x" * MAX_HEADER_BYTES}, b""))


def test_no_client_json_looks_like_a_media_frame():
    for text in ('{"type": "audio_chunk"}', " {}", "[]"):
        for encoding in ("utf-8", "utf-16-be", "utf-16-le", "utf-32-be", "utf-32-le"):
            assert not is_media_frame(text.encode(encoding))
    assert not is_media_frame(MAGIC.decode("latin-1"))  # text frames never are


# --- what the gateway sends ------------------------------------------------------------


def test_a_duplex_chunk_goes_as_its_bytes_and_its_other_fields():
    message = typed(duplex, {"type": "audio_chunk", "audio_base64": b64(SECOND),
                             "frame_base64_list": [b64(JPEG)], "force_listen": True,
                             "max_slice_nums": 2, "input_id": "in_7", "unknown": 1})  # fmt: skip
    media = media_message(message)
    assert media == MediaMessage(
        {"type": "audio_chunk", "force_listen": True, "max_slice_nums": 2, "input_id": "in_7"},
        SECOND,
        (JPEG,),
    )
    # The worker validates the header's fields as the protocol's ChunkFields:
    # the same values the text would have given it.
    assert duplex.ChunkFields.model_validate(media.fields) == duplex.ChunkFields(
        **message.model_dump(exclude={"audio_base64", "frame_base64_list"})
    )


def test_a_half_duplex_chunk_goes_as_its_audio():
    message = typed(half_duplex, {"type": "audio_chunk", "audio_base64": b64(SECOND)})
    raw = binary_media("(the client's text)", message)
    assert isinstance(raw, bytes)
    assert decode_media(raw) == MediaMessage({"type": "audio_chunk"}, SECOND)


@pytest.mark.parametrize(
    "fields",
    [
        {"audio_base64": "&" * 16},  # the shape of base64 (the gateway's check), not base64
        {"audio_base64": "AAAA=AAAAAAAAAAA"},
        {"frame_base64_list": [b64(JPEG), "!!!!"]},
    ],
    ids=["audio", "padding", "second-frame"],
)
def test_a_chunk_whose_base64_does_not_decode_goes_on_as_the_client_sent_it(fields: dict):
    """The worker refuses it as it always did: the same error, at the same
    point of the session (after a prepare, never before one)."""
    sent = json.dumps({"type": "audio_chunk", "audio_base64": b64(SECOND), **fields})
    message = typed(duplex, json.loads(sent))
    assert media_message(message) is None
    assert binary_media(sent, message) is sent


@pytest.mark.parametrize(
    "message", [{"type": "prepare"}, {"type": "stop"}, {"type": "pause", "timeout": 3}]
)
def test_every_other_message_goes_as_the_client_sent_it(message: dict):
    sent = json.dumps(message)
    assert binary_media(sent, typed(duplex, message)) is sent
    assert as_sent(sent, typed(duplex, message)) is sent


# --- the decoder's refusals ---------------------------------------------------------------


def test_each_refusal_names_its_reason():
    good = encode_media(MediaMessage({"type": "audio_chunk"}, SECOND, (JPEG,)))
    assert refusal(b"") == "not a media frame"
    assert refusal(b'{"type": "audio_chunk"}') == "not a media frame"
    assert refusal(MAGIC + b"\x00").startswith("truncated: 5 bytes")
    assert refusal(good[:20]).startswith("truncated: 20 bytes, the header ends at")
    assert refusal(MAGIC + (MAX_HEADER_BYTES + 1).to_bytes(4, "big")).startswith("header of ")
    assert refusal(MAGIC + b"\x00\x00\x00\x02\xff\xfe").startswith("header: not UTF-8")
    assert refusal(MAGIC + b"\x00\x00\x00\x01{").startswith("header: message is not JSON")
    assert refusal(frame([1])) == "header: not a JSON object"
    assert refusal(frame({"audio_base64": 0})) == "header has no type"
    assert refusal(frame({"type": 1, "audio_base64": 0})) == "header has no type"
    assert refusal(frame({"type": "a"})).startswith("audio_base64 must be a byte length")
    for bad in (-1, 1.5, True, "4", None):
        assert refusal(frame({"type": "a", "audio_base64": bad})).startswith("audio_base64 ")
    assert refusal(frame({"type": "a", "audio_base64": 0, "frame_base64_list": 3})).startswith(
        "frame_base64_list must be a list"
    )
    listed = {"type": "a", "audio_base64": 0, "frame_base64_list": [-4]}
    assert refusal(frame(listed)).startswith("frame_base64_list must be a byte length")
    assert refusal(good + b"x") == (
        f"the header counts {len(SECOND) + len(JPEG)} bytes of media, "
        f"the frame carries {len(SECOND) + len(JPEG) + 1}"
    )
    assert refusal(frame({"type": "a", "audio_base64": 10**400})).startswith("the header counts")


def _mutations(raw: bytes) -> st.SearchStrategy[bytes]:
    """A valid frame cut, extended or with one byte changed."""
    cut = st.integers(0, len(raw)).map(lambda n: raw[:n])
    extended = st.binary(min_size=1, max_size=8).map(lambda tail: raw + tail)
    flipped = st.tuples(st.integers(0, len(raw) - 1), st.integers(0, 255)).map(
        lambda at: raw[: at[0]] + bytes([at[1]]) + raw[at[0] + 1 :]
    )
    return cut | extended | flipped


_VALID = encode_media(
    MediaMessage({"type": "audio_chunk", "force_listen": True}, b"\0" * 32, (b"ab",))
)
_ANY_FRAME = (
    st.binary(max_size=64)
    | st.binary(max_size=64).map(lambda tail: MAGIC + tail)
    | st.tuples(st.integers(0, 2**32 - 1), st.binary(max_size=64)).map(
        lambda given: MAGIC + given[0].to_bytes(4, "big") + given[1]
    )
    | st.tuples(
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(
                    st.sampled_from(["type", "audio_base64", "frame_base64_list", "x"]),
                    inner,
                    max_size=4,
                )
            ),
        ),
        st.binary(max_size=64),
    ).map(lambda given: frame(given[0], given[1]))
    | _mutations(_VALID)
)


@given(raw=_ANY_FRAME)
@example(raw=MAGIC + b"\x00\x00\x00\x05[[[[[")
@example(raw=frame({"type": "a", "audio_base64": 0, "frame_base64_list": [True]}))
def test_every_byte_string_is_a_frame_or_refused_with_a_documented_reason(raw: bytes):
    try:
        message = decode_media(raw)
    except MediaFrameError as exc:
        assert str(exc).startswith(REASONS), exc
        return
    # Accepted: the header's lengths slice the frame's media exactly.
    assert isinstance(message.type, str) and isinstance(message.audio, bytes)
    frames = message.frames or ()
    assert all(isinstance(one, bytes) for one in frames)
    assert raw.endswith(message.audio + b"".join(frames))

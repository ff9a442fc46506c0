"""The gateway ↔ media process channel without sockets: every message round
trips through its frame, in any split; anything else is a WireError."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from omnilive.gateway.webrtc.media_wire import (
    MAX_FRAME_BYTES,
    Answered,
    Closed,
    Decoder,
    HangUp,
    Hello,
    OpenCall,
    Refused,
    WireError,
    encode,
)

MESSAGES = [
    Hello(1234),
    OpenCall(
        "rtc_1",
        "duplex",
        "v=0\r\n",
        "/ws/duplex/dx",
        "mode=omni",
        "pass",
        frame_max_side=1280,
        media=("audio", "video", "application"),
        first_events=('{"type": "session.start"}',),
        user_agent="Chromium",
    ),
    Answered("rtc_1", "v=0\r\n"),
    Refused("rtc_1", 429, "too_many_sessions", "the key holds its sessions"),
    HangUp("rtc_1"),
    Closed("rtc_1"),
]


def test_every_message_round_trips():
    decoder = Decoder()
    assert decoder.feed(b"".join(encode(m) for m in MESSAGES)) == MESSAGES
    assert decoder.pending == 0


@given(st.lists(st.integers(min_value=0, max_value=400), max_size=12))
def test_any_split_gives_the_same_messages(cuts: list[int]):
    stream = b"".join(encode(m) for m in MESSAGES)
    decoder = Decoder()
    got, start = [], 0
    for cut in sorted(cuts):
        got += decoder.feed(stream[start:cut])
        start = max(start, cut)
    got += decoder.feed(stream[start:])
    assert got == MESSAGES


@given(st.binary(max_size=200))
def test_any_bytes_are_messages_or_a_wire_error(data: bytes):
    with contextlib.suppress(WireError):
        Decoder(max_frame_bytes=1000).feed(data)


@pytest.mark.parametrize(
    "payload",
    [b"{}", b"[]", b"not json", b'{"type": "hello"}', b'{"type": "answered", "call_id": 1}',
     b'{"type": "hang_up"}', b'{"type": "refused", "call_id": "x", "status": "many"}'],
)  # fmt: skip
def test_frames_that_are_no_message(payload: bytes):
    frame = len(payload).to_bytes(4, "big") + payload
    with pytest.raises(WireError):
        Decoder().feed(frame)


def test_a_frame_over_the_limit_is_refused_before_it_is_read():
    with pytest.raises(WireError, match="over the limit"):
        Decoder().feed((MAX_FRAME_BYTES + 1).to_bytes(4, "big"))
    with pytest.raises(WireError):
        encode(Answered("rtc_1", "x" * MAX_FRAME_BYTES))

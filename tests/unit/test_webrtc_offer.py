"""The signalling request's checks, socket-free, and a fuzzer: every body is
an offer or a documented refusal, never a traceback."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from omnilive.gateway.webrtc.offer import (
    MAX_OFFER_BYTES,
    OfferError,
    OfferErrorCode,
    check_sdp,
    parse_live_offer,
    parse_offer,
)

OFFER = """v=0
o=- 1 2 IN IP4 127.0.0.1
s=-
t=0 0
a=fingerprint:sha-256 AA:BB
m=audio 9 UDP/TLS/RTP/SAVPF 111
a=mid:0
a=sendrecv
a=rtpmap:111 opus/48000/2
m=video 9 UDP/TLS/RTP/SAVPF 96
a=mid:1
a=sendonly
m=application 9 UDP/DTLS/SCTP webrtc-datachannel
a=mid:2
"""


def test_a_browser_like_offer():
    offer = parse_offer(OFFER.encode(), "application/sdp")
    assert offer.media == ("audio", "video", "application")
    assert offer.has_video and offer.session is None
    assert offer.sdp.endswith("\r\n") and "\r\nm=audio" in offer.sdp


@pytest.mark.parametrize(
    ("sdp", "code"),
    [
        ("", OfferErrorCode.INVALID_SDP),
        ("hello", OfferErrorCode.INVALID_SDP),
        (OFFER.replace("a=fingerprint:sha-256 AA:BB\n", ""), OfferErrorCode.INVALID_SDP),
        (OFFER.replace("m=audio 9 UDP/TLS/RTP/SAVPF 111\n", ""), OfferErrorCode.NO_AUDIO),
        (OFFER.replace("m=application", "x=application"), OfferErrorCode.NO_DATA_CHANNEL),
    ],
)
def test_refusals(sdp: str, code: OfferErrorCode):
    with pytest.raises(OfferError) as raised:
        check_sdp(sdp)
    assert raised.value.code is code and raised.value.status == 400


def test_media_types():
    with pytest.raises(OfferError) as raised:
        parse_offer(b"{}", "application/json")
    assert raised.value.status == 415
    assert parse_offer(OFFER.encode(), "application/sdp; charset=utf-8").media[0] == "audio"


def test_openai_multipart_form():
    form = {"sdp": OFFER, "session": json.dumps({"type": "realtime", "instructions": "Hi"})}
    offer = parse_offer(b"", "multipart/form-data; boundary=x", form)
    assert offer.session == {"type": "realtime", "instructions": "Hi"}
    for session in ("[1]", "not json"):
        with pytest.raises(OfferError) as raised:
            parse_offer(b"", "multipart/form-data", {"sdp": OFFER, "session": session})
        assert raised.value.code is OfferErrorCode.INVALID_SESSION
    with pytest.raises(OfferError):
        parse_offer(b"", "multipart/form-data", {"session": "{}"})


@pytest.mark.parametrize("depth", [65, 30_000])
def test_a_deep_session_is_refused_as_any_deep_json(depth: int):
    """The form's ``session`` goes through the one client-JSON decoder: its
    depth rule, not the interpreter's recursion limit (a 500 with a traceback)."""
    deep = '{"a":' * depth + "1" + "}" * depth
    with pytest.raises(OfferError) as raised:
        parse_offer(b"", "multipart/form-data", {"sdp": OFFER, "session": deep})
    assert raised.value.code is OfferErrorCode.INVALID_SESSION


@pytest.mark.parametrize(
    ("line", "replacement"),
    [
        ("a=mid:0\n", ""),
        ("a=mid:2\n", "a=mid:\n"),
        ("a=sendrecv\n", ""),
        ("a=sendonly\n", "a=sendrecx\n"),
        ("m=audio 9 UDP/TLS/RTP/SAVPF 111", "m=audio 9 UDP/TL"),
        ("m=video 9 UDP/TLS/RTP/SAVPF 96", "m=video x UDP/TLS/RTP/SAVPF 96"),
    ],
)
def test_sections_aiortc_cannot_answer(line: str, replacement: str):
    """What aiortc takes for granted in a media section is checked first: it
    answers such an offer with an exception of its own code's, or a
    connection task that fails later."""
    with pytest.raises(OfferError) as raised:
        check_sdp(OFFER.replace(line, replacement))
    assert raised.value.code is OfferErrorCode.INVALID_SDP


def test_size_and_encoding():
    with pytest.raises(OfferError):
        parse_offer(b"v=0\n" + b"a" * MAX_OFFER_BYTES, "application/sdp")
    with pytest.raises(OfferError):
        parse_offer(b"\xff\xfe", "application/sdp")


@given(st.binary(max_size=2048), st.sampled_from(["application/sdp", "text/plain", "image/png"]))
def test_any_body_is_an_offer_or_a_documented_refusal(body: bytes, content_type: str):
    try:
        parse_offer(body, content_type)
    except OfferError as exc:
        assert exc.code in set(OfferErrorCode) and exc.status in (400, 415)


def test_the_live_api_s_json_body():
    body = {"session": {"model": "gpt-live-1"}, "transport": {"type": "webrtc", "sdp": OFFER}}
    offer = parse_live_offer(json.dumps(body).encode(), "application/json; charset=utf-8")
    assert offer.session == {"model": "gpt-live-1"} and offer.media[0] == "audio"
    body["transport"]["sdp"] = OFFER.replace("m=audio", "m=text")
    with pytest.raises(OfferError) as raised:
        parse_live_offer(json.dumps(body).encode(), "application/json")
    assert raised.value.code is OfferErrorCode.NO_AUDIO


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=9), inner),
    max_leaves=12,
)


@given(
    st.one_of(st.binary(max_size=512), JSON_VALUES.map(lambda v: json.dumps(v).encode())),
    st.sampled_from(["application/json", "application/sdp"]),
)
def test_any_live_body_is_an_offer_or_a_documented_refusal(body: bytes, content_type: str):
    try:
        parse_live_offer(body, content_type)
    except OfferError as exc:
        assert exc.code in set(OfferErrorCode) and exc.status in (400, 415)

"""The one decoder of client JSON, the HTTP error rules and the small pieces
issue 32 fixed, socket-free (the same cases against a real server are in
tests/security/test_bad_input.py)."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image
from starlette.websockets import WebSocketDisconnect, WebSocketState

from omnilive.engines.messages import GenerationOptions
from omnilive.gateway.auth import origin_allowed
from omnilive.gateway.http_body import is_json_type
from omnilive.gateway.http_errors import status_for
from omnilive.gateway.realtime.machine import Close, RealtimeMachine, ToClient
from omnilive.protocol.common import (
    MAX_JSON_DEPTH,
    ErrorCode,
    ProtocolError,
    json_depth,
    load_json,
)
from omnilive.worker.decode import MAX_IMAGE_PIXELS, DecodeError, check_image
from omnilive.wsutil import receive_frame


def refused(raw: str | bytes, max_bytes: int | None = None) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        load_json(raw, max_bytes)
    return caught.value


def nested(depth: int) -> str:
    return '{"a":' * (depth - 1) + "[1]" + "}" * (depth - 1)


def test_depth_is_measured_without_recursion():
    assert json_depth(1) == 0
    assert json_depth([]) == 1
    assert json_depth({"a": [1, {"b": []}]}) == 4
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    assert json_depth(deep) == 100_001


def test_nesting_up_to_the_limit_passes_and_beyond_it_is_invalid_json():
    assert json_depth(load_json(nested(MAX_JSON_DEPTH))) == MAX_JSON_DEPTH
    assert refused(nested(MAX_JSON_DEPTH + 1)).code is ErrorCode.INVALID_JSON
    # Past the interpreter's own recursion limit too, as text and as bytes.
    for raw in ("[" * 100_000 + "]" * 100_000, b"{" * 5 + b"[" * 50_000):
        error = refused(raw)
        assert error.code is ErrorCode.INVALID_JSON


def test_what_is_not_json_is_invalid_json_and_size_comes_first():
    too_long = "[" + "7" * 5000 + "]"  # more digits than Python turns into an int
    for raw in ('{"a": NaN}', "[Infinity]", "[-Infinity]", "{", b"\xff", '["\\ud800"]', too_long):
        assert refused(raw).code is ErrorCode.INVALID_JSON, raw
    assert refused("[" * 200, max_bytes=100).code is ErrorCode.PAYLOAD_TOO_LARGE
    assert load_json('{"a": 1.5e300}') == {"a": 1.5e300}


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(), lambda c: (
    st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3))))  # fmt: skip
def test_any_json_value_within_the_limit_comes_back_as_it_was(value):
    raw = json.dumps(value)
    if json_depth(value) <= MAX_JSON_DEPTH:
        assert load_json(raw) == value
    else:
        assert refused(raw).code is ErrorCode.INVALID_JSON


def test_the_older_realtime_dialect_refuses_an_oversize_frame_and_goes_on():
    machine = RealtimeMachine("audio", "rt_1", 8192, max_bytes=64)
    [action] = machine.client_frame(json.dumps({"type": "session.update", "x": "y" * 64}))
    assert isinstance(action, ToClient)
    assert action.event["error"]["code"] == "payload_too_large"
    assert machine.client_frame("[" * 60) == [Close(1003)]  # not JSON: closed, as documented


def test_http_statuses_follow_the_codes():
    assert status_for(ErrorCode.INVALID_REQUEST) == 422
    assert status_for(ErrorCode.INVALID_JSON) == 422
    assert status_for(ErrorCode.PAYLOAD_TOO_LARGE) == 413
    assert status_for(ErrorCode.UNSUPPORTED_MEDIA_TYPE) == 415
    assert status_for(ErrorCode.QUEUE_FULL) == 503
    assert status_for("audio_too_long") == 422
    assert [t for t in ("", "application/json", "application/json; charset=utf-8",
                        "application/merge-patch+json", "text/plain", "text/json",
                        "multipart/form-data; boundary=x") if is_json_type(t)] == [
        "", "application/json", "application/json; charset=utf-8",
        "application/merge-patch+json"]  # fmt: skip


def test_an_origin_must_be_a_web_page_of_the_same_host():
    assert origin_allowed("http://127.0.0.1:8006", "127.0.0.1:8006", [])
    assert origin_allowed("https://127.0.0.1:8006", "127.0.0.1:8006", [])
    for scheme in ("ftp", "ws", "file", "chrome-extension"):
        assert not origin_allowed(f"{scheme}://127.0.0.1:8006", "127.0.0.1:8006", [])
    # Over TLS, only an https page is the same origin.
    assert not origin_allowed("http://example.com", "example.com", [], secure=True)
    assert origin_allowed("https://example.com", "example.com", [], secure=True)


async def test_a_peer_that_has_left_is_not_read_again():
    """Readers take turns on one socket; one that comes after the peer left
    must see a disconnect, not Starlette's refusal to receive again."""

    async def receive() -> dict:
        raise AssertionError("receive() after the disconnect was read")

    gone = SimpleNamespace(client_state=WebSocketState.DISCONNECTED, receive=receive)
    with pytest.raises(WebSocketDisconnect):
        await receive_frame(gone)  # type: ignore[arg-type]


def _png(size: tuple[int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("L", size).save(buffer, "PNG")
    return buffer.getvalue()


def test_an_image_too_large_to_decode_is_refused_from_its_header():
    assert check_image(_png((64, 48))) is not None
    side = int(MAX_IMAGE_PIXELS**0.5) + 1
    with pytest.raises(DecodeError, match="pixels"):
        check_image(_png((side, side)))


def test_greedy_decoding_is_do_sample_false_or_temperature_zero():
    assert not GenerationOptions().greedy
    assert GenerationOptions(do_sample=False).greedy
    assert GenerationOptions(temperature=0.0).greedy

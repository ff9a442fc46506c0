"""A call's session hears how the call ended: a hang-up (the peer closed) is
a normal close, a connection that failed (the network) is a lost one, which
suspends a resumable session for a new offer to continue (docs/resume.md)."""

from __future__ import annotations

import pytest

from omnilive.gateway.webrtc.call import Call
from omnilive.gateway.webrtc.dialects import Dialect, MediaDialect
from omnilive.session_settings import WebRTCSettings


async def disconnect_after(state: str) -> int:
    call = Call("rtc_test", MediaDialect(Dialect.HALF_DUPLEX), WebRTCSettings(), scope={})
    try:
        assert (await call.receive())["type"] == "websocket.connect"
        # What aiortc reports, then tells its listeners.
        call.pc._RTCPeerConnection__connectionState = state  # type: ignore[attr-defined]
        call.pc.emit("connectionstatechange")
        message = await call.receive()
        assert message["type"] == "websocket.disconnect"
        return message["code"]
    finally:
        await call.pc.close()


@pytest.mark.parametrize(("state", "code"), [("failed", 1006), ("closed", 1000)])
async def test_a_failed_connection_is_lost_and_a_closed_one_hung_up(state: str, code: int):
    assert await disconnect_after(state) == code

"""OpenAI's Live API over WebRTC (``POST /v1/live/sessions``, the SDK's
``client.live.create``), through a real ``omnilive serve`` on the scripted
engine with the side Whisper, with an aiortc peer as the browser: the SDK's
own call answers the offer, the session starts on the data channel, the
peer's spoken question is transcribed and delegated, the answer plays on the
track (not as audio deltas on the channel), every event parses as the SDK's
``ServerEvent``, and hanging up ends the session; bad bodies are refused."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from aiortc import RTCSessionDescription
from openai import AsyncOpenAI, RateLimitError
from openai.types.live import ServerEvent
from pydantic import TypeAdapter

from tests.servers import Server
from tests.speech import WEATHER_QUESTION, silence, speak
from tests.webrtc_peer import Peer, until_idle

pytestmark = pytest.mark.shared_server(env={"OMNILIVE_TRANSCRIPTION__WHISPER": "true"})
SERVER_EVENT = TypeAdapter(ServerEvent)
DELEGATING = "You are a travel assistant. Delegate weather questions to the backend."


async def test_the_sdk_s_call_talks_delegates_and_hangs_up(server: Server):
    client = AsyncOpenAI(base_url=f"{server.http}/v1", api_key="any-key-on-an-open-gateway")
    peer = Peer(channel="live-events")
    try:
        # μ-law asked for: the call's audio is the tracks' (PCM at 24 kHz) all the same.
        audio = {"format": {"type": "audio/pcmu", "rate": 8000}}
        session: Any = {"model": "gpt-live-1", "instructions": DELEGATING, "audio": audio}
        created = await client.live.create(
            session=session, transport={"type": "webrtc", "sdp": await peer.offer()}
        )
        assert created.session.id.startswith("rtc_") and created.transport.type == "webrtc"
        await peer.pc.setRemoteDescription(RTCSessionDescription(created.transport.sdp, "answer"))
        started = await peer.until("session.started")
        assert started["session"]["audio"]["format"] == {"type": "audio/pcm", "rate": 24000}
        peer.mic.play(np.concatenate([silence(1.0), speak(WEATHER_QUESTION), silence(2.0)]))
        delegated = await peer.until("session.delegation.created", timeout=40)
        assert delegated["delegation"]["target"] == "client"
        heard = next(e for e in peer.events if e["type"] == "session.input_transcript.delta")
        assert "london" in heard["delta"].lower(), heard
        assert heard["end_ms"] <= delegated["offset_ms"]
        await peer.until("session.output_transcript.delta", timeout=20)
        async with asyncio.timeout(20):
            await peer.sounded.wait()
        assert np.abs(peer.heard_audio()).max() > 0.05, "the answer track played nothing audible"
        kinds = peer.kinds()
        assert "session.output_audio.delta" not in kinds  # the track's, as OpenAI's WebRTC
        for event in peer.events:
            SERVER_EVENT.validate_python(event)
        await client.live.sessions.hangup(created.session.id)
        await until_idle(server)
        async with httpx.AsyncClient() as http:
            again = await http.post(f"{server.http}/v1/live/sessions/{created.session.id}/hangup")
        assert again.status_code == 404 and again.json()["error"]["code"] == "call_not_found"
    finally:
        await peer.close()
        await client.close()


@pytest.mark.parametrize(
    ("body", "content_type", "status", "code"),
    [
        (b"v=0\r\n", "application/sdp", 415, "unsupported_media_type"),
        (b"[1, 2]", "application/json", 400, "invalid_request"),
        (b'{"session": {}, "transport": {"type": "websocket"}}', "application/json", 400,
         "invalid_request"),
        (b'{"session": {}, "transport": {"type": "webrtc"}}', "application/json", 400,
         "invalid_sdp"),
        (b'{"session": 1, "transport": {"type": "webrtc", "sdp": "v=0"}}', "application/json",
         400, "invalid_session"),
        (b'{"session": {}, "transport": {"type": "webrtc", "sdp": "hello"}}',
         "application/json", 400, "invalid_sdp"),
    ],
)  # fmt: skip
async def test_bad_live_bodies_are_refused_in_openai_s_shape(
    server: Server, body: bytes, content_type: str, status: int, code: str
):
    async with httpx.AsyncClient() as http:
        response = await http.post(
            f"{server.http}/v1/live/sessions", content=body, headers={"content-type": content_type}
        )
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code
    assert (await server.get("/api/webrtc/config"))["open"] == 0


async def test_a_refused_start_is_an_error_on_the_channel_and_the_call_goes_on(server: Server):
    """The body's session is the call's first ``session.start``: what that
    would refuse on the WebSocket is an ``error`` on the channel, and the
    peer may start again, as a WebSocket client may."""
    peer = Peer(channel="live-events")
    try:
        body = {"session": {"model": "gpt-live-1", "instructions": 5},
                "transport": {"type": "webrtc", "sdp": await peer.offer()}}  # fmt: skip
        async with httpx.AsyncClient() as http:
            response = await http.post(f"{server.http}/v1/live/sessions", json=body)
        assert response.status_code == 201, response.text
        answer = response.json()["transport"]["sdp"]
        await peer.pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
        error = await peer.until("error", "session.started")
        assert error["type"] == "error", error
        peer.send({"type": "session.start", "session": {"model": "gpt-live-1"}})
        await peer.until("session.started")
    finally:
        await peer.close()
    await until_idle(server)


async def test_a_live_call_takes_the_websocket_path_credentials_and_limits(tmp_path: Path):
    """A gateway with keys: no key is refused before any peer connection (401),
    a key opens a call, and the key's session limit refuses a second
    concurrent one as the WebSocket path would (429 ``too_many_sessions``)."""
    key = "user-key-0123456789abcdef"
    keys = [{"key": key, "max_sessions": 1}]
    server = Server(tmp_path, env={"OMNILIVE_AUTH__KEYS": json.dumps(keys)}, api_key=key).start()
    client = AsyncOpenAI(base_url=f"{server.http}/v1", api_key=key)
    first, second, anonymous = Peer(), Peer(), Peer()
    session: Any = {"model": "gpt-live-1"}
    try:
        await server.wait_ready(workers=1)
        body = {"session": session, "transport": {"type": "webrtc", "sdp": await anonymous.offer()}}
        async with httpx.AsyncClient() as http:
            refused = await http.post(f"{server.http}/v1/live/sessions", json=body)
        assert refused.status_code == 401, refused.text
        opened = await client.live.create(
            session=session, transport={"type": "webrtc", "sdp": await first.offer()}
        )
        await first.pc.setRemoteDescription(RTCSessionDescription(opened.transport.sdp, "answer"))
        await first.until("session.started")
        with pytest.raises(RateLimitError) as again:
            await client.live.create(
                session=session, transport={"type": "webrtc", "sdp": await second.offer()}
            )
        assert again.value.code == "too_many_sessions"
    finally:
        for peer in (first, second, anonymous):
            await peer.close()
        await client.close()
        server.stop()

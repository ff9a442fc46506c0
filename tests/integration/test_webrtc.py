"""WebRTC calls through a real ``omnilive serve`` (scripted engine) with an
aiortc peer as the client: OpenAI's ``POST /v1/realtime/calls`` (a spoken
question heard and transcribed, the answer's audio on the track, events on
``oai-events``, hanging up ends the session), the half-duplex mode, and the
signalling's refusals."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.servers import Server
from tests.speech import silence, speak
from tests.webrtc_peer import Peer, until_idle

pytestmark = pytest.mark.shared_server

GA_SESSION = {
    "type": "session.update",
    "session": {
        "type": "realtime",
        "audio": {
            "input": {
                "transcription": {"model": "whisper-1"},
                "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
            }
        },
    },
}


async def test_a_spoken_question_over_webrtc(server: Server):
    peer = Peer()
    try:
        response = await peer.call(f"{server.http}/v1/realtime/calls?model=omnilive-realtime")
        assert response.status_code == 201, response.text
        assert response.headers["content-type"].startswith("application/sdp")
        assert response.headers["location"].startswith("/v1/realtime/calls/rtc_")
        created = await peer.until("session.created")
        assert created["session"]["id"].startswith("sess_")
        peer.send(GA_SESSION)
        await peer.until("session.updated")
        peer.mic.play(np.concatenate([speak("What is the weather like today?"), silence(1.5)]))
        done = await peer.until("response.done", timeout=40)
        kinds = peer.kinds()
        for kind in (
            "input_audio_buffer.speech_started",
            "input_audio_buffer.speech_stopped",
            "conversation.item.input_audio_transcription.completed",
            "response.output_audio_transcript.done",
        ):
            assert kind in kinds, (kind, kinds)
        # The answer's audio is the track's, as in OpenAI's WebRTC: not on the channel.
        assert "response.output_audio.delta" not in kinds
        heard = next(e for e in peer.events if e["type"].endswith("transcription.completed"))
        assert heard["transcript"].endswith("s of speech")
        assert done["response"]["output"][0]["content"][0]["transcript"].startswith("Turn 0")
        # The track's own events: playing may start after response.done.
        await peer.until("output_audio_buffer.started", timeout=20)
        await peer.until("output_audio_buffer.stopped", timeout=20)
        audio = peer.heard_audio()
        loud = np.abs(audio) > 0.05
        assert loud.sum() > 48_000 * 0.1, "the answer track played no audible audio"
    finally:
        await peer.close()
    await until_idle(server)  # closing the peer ended the session and freed the slot


async def test_omnilives_extensions_on_a_call_only_when_asked(server: Server):
    """A GA call speaks OpenAI's events only, as its WebSocket does; asked for
    (``omnilive_extensions``), it gets its resume token too."""
    for query, resumable in (("", False), ("&omnilive_extensions=true", True)):
        peer = Peer()
        try:
            url = f"{server.http}/v1/realtime/calls?model=omnilive-realtime{query}"
            assert (await peer.call(url)).status_code == 201
            created = await peer.until("session.created")
            assert ("resume_token" in created) is resumable
        finally:
            await peer.close()
        await until_idle(server)


async def test_hang_up_ends_the_session(server: Server):
    peer = Peer()
    try:
        response = await peer.call(f"{server.http}/v1/realtime/calls")
        assert response.status_code == 201, response.text
        await peer.until("session.created")
        async with httpx.AsyncClient() as client:
            hung = await client.post(f"{server.http}/v1/realtime/calls/{peer.call_id}/hangup")
            assert hung.status_code == 200
            await until_idle(server)
            again = await client.post(f"{server.http}/v1/realtime/calls/{peer.call_id}/hangup")
            assert again.status_code == 404
            assert again.json()["error"]["code"] == "call_not_found"
    finally:
        await peer.close()


async def test_the_openai_sdk_opens_and_hangs_up_a_call(server: Server):
    """OpenAI's SDK, unchanged: ``realtime.calls.create`` (the multipart form
    with a session) and ``realtime.calls.hangup``."""
    from aiortc import RTCSessionDescription
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{server.http}/v1", api_key="any-key-on-an-open-gateway")
    peer = Peer()
    try:
        session = {"type": "realtime", "model": "omnilive-realtime", "instructions": "Be brief."}
        answer = await client.realtime.calls.create(sdp=await peer.offer(), session=session)
        call_id = answer.response.headers["location"].rsplit("/", 1)[-1]
        await peer.pc.setRemoteDescription(RTCSessionDescription(answer.text, "answer"))
        updated = await peer.until("session.updated")
        assert updated["session"]["instructions"] == "Be brief."
        await client.realtime.calls.hangup(call_id)
        await until_idle(server)
    finally:
        await peer.close()
        await client.close()


async def prepared_call(peer: Peer, url: str) -> None:
    """A half-duplex call at ``url``, its session prepared."""
    response = await peer.call(url)
    assert response.status_code == 201, response.text
    await peer.opened.wait()
    peer.send({"type": "prepare", "system_prompt": "Be brief."})
    await peer.until("prepared")


async def test_a_half_duplex_call(server: Server):
    peer = Peer(channel="events")
    try:
        await prepared_call(peer, f"{server.http}/api/webrtc/half_duplex/hd_rtc_test")
        peer.mic.play(np.concatenate([speak("Tell me something nice."), silence(2.0)]))
        await peer.until("generating", timeout=30)
        await peer.until("turn_done", timeout=30)
        chunks = [e for e in peer.events if e["type"] == "chunk"]
        assert chunks and all(c["audio_data"] is None for c in chunks)  # audio went on the track
        await asyncio.sleep(1.0)
        assert np.abs(peer.heard_audio()).max() > 0.05
        peer.send({"type": "stop"})
        await peer.until("stopped")
        # The session ended on the server's side: the server closes the call.
        async with asyncio.timeout(10):
            await peer.closed.wait()
    finally:
        await peer.close()
    await until_idle(server)


@pytest.mark.parametrize(
    ("slices", "frame_size"),
    [(None, "640x360"), (2, "1280x720")],  # HD (two slices): frames as the page grabs them
)
async def test_an_omni_duplex_call_with_the_camera(
    server: Server, slices: int | None, frame_size: str
):
    peer = Peer(channel="events", camera=(1280, 720))
    try:
        url = f"{server.http}/api/webrtc/duplex/dx_rtc_test?mode=omni_duplex"
        response = await peer.call(url)
        assert response.status_code == 201, response.text
        await peer.opened.wait()
        prepare = {"type": "prepare", "system_prompt": "Be brief."}
        peer.send({**prepare, **({"max_slice_nums": slices} if slices else {})})
        prepared = await peer.until("prepared")
        assert prepared["mode"] == "omni_duplex"
        peer.mic.play(np.concatenate([speak("What do you see?"), silence(3.0)]))
        async with asyncio.timeout(30):
            while len([e for e in peer.events if e["type"] == "result"]) < 4:
                await peer.until("result")
                await asyncio.sleep(0.2)
        results = [e for e in peer.events if e["type"] == "result"]
        assert all(r["audio_data"] is None for r in results)  # the answer is on the track
        # One camera frame per one-second unit, sampled from the video track.
        assert any(r["vision_slices"] == (slices or 1) for r in results), results
        speaking = [r for r in results if not r["is_listen"]]
        assert speaking and f"frames 1 {frame_size}" in speaking[0]["text"]
        async with asyncio.timeout(5):  # played at real time, behind the results
            await peer.sounded.wait()
        peer.send({"type": "stop"})
        await peer.until("stopped")
    finally:
        await peer.close()
    await until_idle(server)


@pytest.mark.parametrize(
    ("body", "content_type", "status", "code"),
    [
        (b"hello", "application/sdp", 400, "invalid_sdp"),
        (b"{}", "application/json", 415, "unsupported_media_type"),
    ],
)
async def test_bad_offers(server: Server, body: bytes, content_type: str, status: int, code: str):
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{server.http}/v1/realtime/calls", content=body, headers={"Content-Type": content_type}
        )
    assert response.status_code == status
    assert response.json()["error"]["code"] == code


async def test_an_offer_without_audio(server: Server):
    from aiortc import RTCPeerConnection

    pc = RTCPeerConnection()
    pc.createDataChannel("oai-events")
    await pc.setLocalDescription(await pc.createOffer())
    try:
        async with httpx.AsyncClient() as client:
            response = await client.post(
                f"{server.http}/v1/realtime/calls",
                content=pc.localDescription.sdp,
                headers={"Content-Type": "application/sdp"},
            )
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "offer_without_audio"
    finally:
        await pc.close()


async def test_too_many_peer_connections(tmp_path: Path):
    server = Server(tmp_path, env={"OMNILIVE_WEBRTC__MAX_PEER_CONNECTIONS": "1"}).start()
    first, second = Peer(), Peer()
    try:
        await server.wait_ready(workers=1)
        assert (await first.call(f"{server.http}/v1/realtime/calls")).status_code == 201
        refused = await second.call(f"{server.http}/v1/realtime/calls")
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "too_many_peer_connections"
    finally:
        await first.close()
        await second.close()
        server.stop()


async def test_a_call_that_never_connects_is_closed(tmp_path: Path):
    """No ICE candidates in the offer: the call never connects; hanging up
    ends one at once, and the connect timeout ends another."""
    server = Server(tmp_path, env={"OMNILIVE_WEBRTC__CONNECT_TIMEOUT_S": "2"}).start()
    peer = Peer(channel="events")
    try:
        await server.wait_ready(workers=1)
        sdp = await peer.offer()
        sdp = "\r\n".join(line for line in sdp.split("\r\n") if "candidate" not in line)
        async with httpx.AsyncClient() as client:
            for session_id in ("adx_never_1", "adx_never_2"):
                response = await client.post(
                    f"{server.http}/api/webrtc/duplex/{session_id}",
                    content=sdp,
                    headers={"Content-Type": "application/sdp"},
                )
                assert response.status_code == 201, response.text
            first = response.headers["x-call-id"]
            assert (await server.get("/api/webrtc/config"))["open"] == 2
            await client.post(f"{server.http}/v1/realtime/calls/{first}/hangup")
        await until_idle(server, timeout=5)  # one hung up, one timed out
    finally:
        await peer.close()
        server.stop()


async def test_calls_take_the_websocket_path_credentials_and_limits(tmp_path: Path):
    """A gateway with keys: no key is refused before any peer connection; a
    client token opens a call; the key's session limit refuses a second
    concurrent call as the WebSocket path would (429 too_many_sessions)."""
    key = "user-key-0123456789abcdef"
    keys = [{"key": key, "max_sessions": 1}]
    server = Server(tmp_path, env={"OMNILIVE_AUTH__KEYS": json.dumps(keys)}, api_key=key).start()
    first, second, anonymous = Peer(), Peer(), Peer()
    try:
        await server.wait_ready(workers=1)
        url = f"{server.http}/v1/realtime/calls"
        refused = await anonymous.call(url)
        assert refused.status_code == 401
        async with httpx.AsyncClient() as client:
            minted = await client.post(
                f"{server.http}/v1/realtime/client_secrets",
                json={},
                headers={"Authorization": f"Bearer {key}"},
            )
        token = minted.json()["value"]
        opened = await first.call(url, {"Authorization": f"Bearer {token}"})
        assert opened.status_code == 201, opened.text
        await first.until("session.created")
        again = await second.call(url, {"Authorization": f"Bearer {key}"})
        assert again.status_code == 429, again.text
        assert again.json()["error"]["code"] == "too_many_sessions"
    finally:
        for peer in (first, second, anonymous):
            await peer.close()
        server.stop()


@pytest.mark.cascade
async def test_whisper_hears_the_question_through_opus(tmp_path: Path):
    """The cascade engine (real VAD, Whisper, SmolLM2, Piper) over a call: the
    question, Opus-coded and resampled by the gateway, is transcribed, and
    the spoken answer plays on the track."""
    server = Server(tmp_path, engine="cascade").start()
    peer = Peer()
    try:
        await server.wait_ready(timeout=180, workers=1)
        response = await peer.call(f"{server.http}/v1/realtime/calls?model=omnilive-realtime")
        assert response.status_code == 201, response.text
        await peer.until("session.created")
        session = {"type": "realtime", "instructions": "You are a helpful voice assistant."}
        session["audio"] = {"input": {"transcription": {"model": "whisper-base"},
                                      "turn_detection": {"type": "server_vad",
                                                         "silence_duration_ms": 600}}}  # fmt: skip
        peer.send({"type": "session.update", "session": session})
        await peer.until("session.updated")
        peer.mic.play(np.concatenate([speak("What is the capital of France?"), silence(2.0)]))
        heard = await peer.until(
            "conversation.item.input_audio_transcription.completed", timeout=60
        )
        assert "capital" in heard["transcript"].lower(), heard
        done = await peer.until("response.done", timeout=120)
        assert done["response"]["status"] == "completed"
        async with asyncio.timeout(20):
            await peer.sounded.wait()
    finally:
        await peer.close()
        server.stop()


async def test_a_lost_call_is_continued_by_a_new_offer(server: Server):
    """A page whose network changed offers again with its session's resume
    token (docs/resume.md): the new call takes the session over (the old
    one is closed), the events it missed are replayed, and the conversation
    goes on over the new connection."""
    first, second = Peer(channel="events"), Peer(channel="events")
    try:
        await prepared_call(first, f"{server.http}/api/webrtc/half_duplex/hd_rtc_resume")
        token = next(e["resume_token"] for e in first.events if "resume_token" in e)
        resume = f"resume_token={token}&last_seq={len(first.events) - 1}"  # one event missed
        url = f"{server.http}/api/webrtc/half_duplex/hd_rtc_resume?{resume}"
        response = await second.call(url)
        assert response.status_code == 201, response.text
        resumed = await second.until("session.resumed")
        assert resumed["replayed"] == 1 and resumed["events_lost"] == 0
        await second.until("prepared", timeout=5)  # the missed event, replayed
        async with asyncio.timeout(10):
            await first.closed.wait()
        second.mic.play(np.concatenate([speak("Tell me something nice."), silence(2.0)]))
        await second.until("turn_done", timeout=30)
        second.send({"type": "stop"})
        await second.until("stopped")
    finally:
        await first.close()
        await second.close()
    await until_idle(server)

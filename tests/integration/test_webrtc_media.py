"""WebRTC calls run by media processes (``webrtc.media_processes``), through
a real ``omnilive serve`` with two of them and an aiortc peer: the calls of
``test_webrtc.py`` (a spoken GA turn answered on the track, half-duplex,
omni with the camera, hang-ups, the OpenAI SDK, a lost call continued by a
new offer, ``max_peer_connections``, the key's credentials and session limit
refusing a call) and of ``test_webrtc_signalling.py`` (broken offers, a
resume with a one-session key, deep JSON on the channel) again, each call's
session a loopback WebSocket from its media process; and a media process
killed mid-call: its call leaves the registry, one line says so, it is
started again, and the gateway goes on answering calls."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import httpx
import pytest

from tests.integration import test_webrtc as rtc
from tests.integration import test_webrtc_signalling as signalling
from tests.integration.test_webrtc import prepared_call
from tests.servers import Server
from tests.webrtc_peer import MEDIA_ENV, Peer, media_pids

pytestmark = [pytest.mark.shared_server(env=MEDIA_ENV), pytest.mark.usefixtures("media_processes")]

# The calls of test_webrtc.py again, through the media processes.
test_a_spoken_question_over_webrtc = rtc.test_a_spoken_question_over_webrtc
test_hang_up_ends_the_session = rtc.test_hang_up_ends_the_session
test_the_openai_sdk_opens_and_hangs_up_a_call = rtc.test_the_openai_sdk_opens_and_hangs_up_a_call
test_a_half_duplex_call = rtc.test_a_half_duplex_call
test_an_omni_duplex_call_with_the_camera = rtc.test_an_omni_duplex_call_with_the_camera
test_a_lost_call_is_continued_by_a_new_offer = rtc.test_a_lost_call_is_continued_by_a_new_offer
test_too_many_peer_connections = rtc.test_too_many_peer_connections
test_a_call_that_never_connects_is_closed = rtc.test_a_call_that_never_connects_is_closed
test_calls_take_the_websocket_path_credentials_and_limits = (
    rtc.test_calls_take_the_websocket_path_credentials_and_limits
)
test_a_websocket_session_resumes_over_webrtc_with_a_one_session_key = (
    signalling.test_a_websocket_session_resumes_over_webrtc_with_a_one_session_key
)
test_broken_offers_are_refused_and_give_their_place_back = (
    signalling.test_broken_offers_are_refused_and_give_their_place_back
)
test_deep_json_on_the_data_channel_is_an_error_and_the_call_goes_on = (
    signalling.test_deep_json_on_the_data_channel_is_an_error_and_the_call_goes_on
)


async def until_config(server: Server, key: str, value: int, timeout: float = 10) -> None:
    """``/api/webrtc/config`` once its ``key`` is ``value``."""
    async with asyncio.timeout(timeout):
        while True:
            if (await server.get("/api/webrtc/config"))[key] == value:
                return
            await asyncio.sleep(0.05)


async def test_calls_spread_over_the_media_processes(server: Server):
    config = await server.get("/api/webrtc/config")
    assert config["media_processes"] == 2 and config["media_ready"] == 2
    peers = [Peer(channel="events") for _ in range(2)]
    try:
        for k, peer in enumerate(peers):
            response = await peer.call(f"{server.http}/api/webrtc/half_duplex/hd_spread_{k}")
            assert response.status_code == 201, response.text
        # One call each (the least loaded takes the next), the second one queued.
        assert (await server.get("/api/webrtc/config"))["media_calls"] == [1, 1]
    finally:
        for peer in peers:
            await peer.close()


async def test_a_killed_media_process_ends_its_calls_and_is_started_again(tmp_path: Path):
    env = {"OMNILIVE_WEBRTC__MEDIA_PROCESSES": "1", "OMNILIVE_LIMITS__RESUME_GRACE_S": "1"}
    server = Server(tmp_path, env=env).start()
    lost, after = Peer(channel="events"), Peer(channel="events")
    try:
        await server.wait_ready(workers=1)
        await prepared_call(lost, f"{server.http}/api/webrtc/half_duplex/hd_killed")
        [pid] = media_pids(server)
        os.kill(pid, signal.SIGKILL)
        await until_config(server, "open", 0)  # the call left the registry with its process
        await server.wait_idle()  # its session, its connection lost, ended after the grace
        await until_config(server, "media_ready", 1)
        assert media_pids(server) != [pid]
        assert f"media process m0 (pid {pid}) is gone: its 1 calls ended" in server.full_log()
        # Its call is gone for a hang-up too; a new call is served by the new process.
        async with httpx.AsyncClient() as client:
            hung = await client.post(f"{server.http}/v1/realtime/calls/{lost.call_id}/hangup")
        assert hung.status_code == 404
        await prepared_call(after, f"{server.http}/api/webrtc/half_duplex/hd_after")
        assert "Traceback" not in server.full_log()
    finally:
        await lost.close()
        await after.close()
        server.stop()

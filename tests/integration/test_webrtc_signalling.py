"""WebRTC signalling against bad input and limits, through a real
``omnilive serve``: a resume over a call is no new session of its key;
broken offers are refused with a documented code and give their place under
``max_peer_connections`` back; a body that never comes is refused in time;
what the session would refuse is refused before the answer; and deep JSON
on the data channel is the session's error, not the call's end."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from pathlib import Path

import httpx
from websockets.asyncio.client import connect

from tests.clients import EventSocket
from tests.servers import Server
from tests.tcp_proxy import TcpProxy
from tests.webrtc_peer import Peer

KEY = "one-session-key-0123456789abcdef"


async def test_a_websocket_session_resumes_over_webrtc_with_a_one_session_key(tmp_path: Path):
    """The key may hold one session: the one it opened on a WebSocket, whose
    connection dropped, continues over a call; the offer is not a second."""
    keys = [{"key": KEY, "max_sessions": 1}]
    server = Server(tmp_path, env={"OMNILIVE_AUTH__KEYS": json.dumps(keys)}, api_key=KEY).start()
    proxy = await TcpProxy(server.port).start()
    peer = Peer(channel="events")
    try:
        await server.wait_ready(workers=1)
        sid = f"s_{secrets.token_hex(4)}"
        url = f"{proxy.ws}/ws/half_duplex/{sid}?seq=1"
        ws = await connect(url, max_size=None, additional_headers=server.headers)
        client = EventSocket(ws)
        token = (await client.until("queue_done"))["resume_token"]
        await client.send({"type": "prepare", "system_prompt": "Be brief.", "config": {}})
        last_seq = (await client.until("prepared"))["seq"]
        proxy.cut()
        resume = f"resume_token={token}&last_seq={last_seq}"
        response = await peer.call(
            f"{server.http}/api/webrtc/half_duplex/{sid}?{resume}", server.headers
        )
        assert response.status_code == 201, response.text
        resumed = await peer.until("session.resumed")
        assert resumed["session_id"] == sid and resumed["events_lost"] == 0
        peer.send({"type": "stop"})
        await peer.until("stopped")
    finally:
        await peer.close()
        await proxy.close()
        server.stop()


async def offer_sdp() -> str:
    peer = Peer()
    try:
        return await peer.offer()
    finally:
        await peer.close()


def broken_offers(sdp: str) -> list[str]:
    """The offer with each line deleted, garbled, or cut in half."""
    lines = sdp.split("\r\n")
    offers = []
    for i, line in enumerate(lines):
        for changed in ([], [line[:2] + "x" + line[3:]], [line[: len(line) // 2]]):
            offers.append("\r\n".join(lines[:i] + changed + lines[i + 1 :]))
    return offers


async def test_broken_offers_are_refused_and_give_their_place_back(tmp_path: Path):
    """Every offer with a line deleted, garbled or cut is answered (201) or
    refused with a documented code (never a 500), and none keeps its place
    under ``max_peer_connections``: a sound offer is answered after them."""
    server = Server(tmp_path, env={"OMNILIVE_WEBRTC__MAX_PEER_CONNECTIONS": "4"}).start()
    peer = Peer()
    try:
        await server.wait_ready(workers=1)
        sdp = await offer_sdp()
        statuses: dict[int, int] = {}
        async with httpx.AsyncClient(base_url=server.http, timeout=30) as http:
            for body in broken_offers(sdp):
                response = await http.post(
                    "/v1/realtime/calls", content=body, headers={"Content-Type": "application/sdp"}
                )
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                if response.status_code == 201:  # a change aiortc can live with: hang it up
                    call_id = response.headers["location"].rsplit("/", 1)[-1]
                    await http.post(f"/v1/realtime/calls/{call_id}/hangup")
                else:
                    assert response.status_code == 400, response.text
                    code = response.json()["error"]["code"]
                    assert code in (
                        "invalid_sdp",
                        "offer_without_audio",
                        "offer_without_data_channel",
                    )
        assert statuses.get(400, 0) >= 30, statuses
        assert (await peer.call(f"{server.http}/v1/realtime/calls")).status_code == 201
        assert "Traceback" not in server.full_log()
    finally:
        await peer.close()
        server.stop()


async def post_raw(port: int, head: bytes, body: bytes, wait_s: float = 0) -> bytes:
    """A request written by hand (a body shorter than announced, a client
    that leaves mid-body); what the server answered, if anything."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head + body)
        await writer.drain()
        if wait_s:
            await asyncio.sleep(wait_s)
            return b""
        async with asyncio.timeout(30):
            return await reader.read()
    finally:
        writer.close()


def head_of(path: str, content_type: str, length: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {length}\r\nConnection: close\r\n\r\n"
    ).encode()


async def test_bodies_that_never_come(tmp_path: Path):
    """An offer announcing 10 GB is refused at once (over its cap); one
    announcing 100 bytes and sending 5 is refused when its body stops
    arriving (``limits.body_timeout_s``), as any route's body is; a client
    that leaves mid-body leaves no traceback behind."""
    env = {"OMNILIVE_LIMITS__BODY_TIMEOUT_S": "1.5"}
    server = Server(tmp_path, env=env).start()
    try:
        await server.wait_ready(workers=1)
        started = time.monotonic()
        head = head_of("/v1/realtime/calls", "application/sdp", 10 * 1024**3)
        answer = await post_raw(server.port, head, b"v=0\r\n")
        assert answer.startswith(b"HTTP/1.1 413") and time.monotonic() - started < 1.5, answer
        for path, kind in [
            ("/v1/realtime/calls", "application/sdp"),
            ("/api/webrtc/half_duplex/s_body", "multipart/form-data; boundary=x"),
            ("/v1/realtime/client_secrets", "application/json"),
            ("/api/chat", "application/json"),
        ]:
            started = time.monotonic()
            answer = await post_raw(server.port, head_of(path, kind, 100), b"v=0\r\n")
            assert answer.startswith(b"HTTP/1.1 408"), (path, answer)
            assert b'"code":"timeout"' in answer and 1.4 < time.monotonic() - started < 5
            await post_raw(server.port, head_of(path, kind, 100), b"v=0\r\n", wait_s=0.2)
        await asyncio.sleep(0.5)
        assert "Traceback" not in server.full_log(), server.log()
    finally:
        server.stop()


async def test_what_the_session_would_refuse_is_refused_before_the_answer(server: Server):
    """A forged resume token and a session id the route refuses: the client
    hears why as the signalling's answer, not after a 201 on a call whose
    channel closes before it opens."""
    peer = Peer(channel="events")
    try:
        forged = await peer.call(f"{server.http}/api/webrtc/half_duplex/x?resume_token=forged")
        assert forged.status_code == 409 and forged.json()["code"] == "resume_refused"
        openai = await peer.call(f"{server.http}/v1/realtime/calls?resume_token=forged")
        assert openai.status_code == 409
        assert openai.json()["error"]["code"] == "resume_refused"
        dots = await peer.call(f"{server.http}/api/webrtc/duplex/%2E%2E")
        assert dots.status_code == 400 and dots.json()["code"] == "invalid_request", dots.text
        assert (await server.get("/api/webrtc/config"))["open"] == 0
    finally:
        await peer.close()


async def test_deep_json_on_the_data_channel_is_an_error_and_the_call_goes_on(server: Server):
    peer = Peer(channel="events")
    try:
        response = await peer.call(f"{server.http}/api/webrtc/half_duplex/s_deep_dc")
        assert response.status_code == 201, response.text
        await peer.opened.wait()
        peer.channel.send('{"a":' * 30_000 + "1" + "}" * 30_000)
        error = await peer.until("error")
        assert error["code"] == "invalid_json", error
        peer.send({"type": "prepare", "system_prompt": "Be brief."})
        await peer.until("prepared")
        assert not peer.closed.is_set()
    finally:
        await peer.close()
    assert "Traceback" not in server.full_log()

"""Every limit: just under passes, just over is refused with its documented code.

The per-key limits (sessions, requests per minute) are in test_keys_live.py.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from websockets.asyncio.client import connect

from omnilive.config import LimitSettings
from omnilive.gateway.credentials import Principal, Role
from omnilive.gateway.limits import KeyLimiter, check_message
from omnilive.protocol.common import ErrorCode, ProtocolError
from omnilive.protocol.duplex import client_message as duplex_message
from omnilive.protocol.half_duplex import client_message as half_duplex_message
from tests.clients import Client, open_client
from tests.recordings import jpeg
from tests.servers import Server, chat_once

MAX_BYTES = 300_000
FRAME = jpeg((10, 200, 30))
LIMITS = {
    "OMNILIVE_LIMITS__MAX_MESSAGE_BYTES": str(MAX_BYTES),
    "OMNILIVE_LIMITS__MAX_CHAT_MESSAGES": "4",
    "OMNILIVE_LIMITS__MAX_CHAT_AUDIO_S": "1",
    "OMNILIVE_LIMITS__MAX_CHUNK_AUDIO_S": "2",
    "OMNILIVE_LIMITS__MAX_FRAMES_PER_CHUNK": "2",
    "OMNILIVE_LIMITS__MAX_FRAME_BYTES": str(len(FRAME)),
    "OMNILIVE_LIMITS__MAX_PREPARE_AUDIO_S": "1",
    "OMNILIVE_LIMITS__MAX_SESSION_TIMEOUT_S": "5",
    "OMNILIVE_DUPLEX__MAX_PAUSE_S": "3",
    "OMNILIVE_MAX_QUEUE_SIZE": "1",
}


def pcm(samples: int) -> str:
    return base64.b64encode(np.full(samples, 0.01, "<f4").tobytes()).decode()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture
async def limited(tmp_path: Path) -> AsyncIterator[Server]:
    server = Server(tmp_path, env=LIMITS).start()
    try:
        await server.wait_ready(workers=1)
        yield server
    finally:
        server.stop()


async def answer(client: Client, *types: str) -> dict:
    """The next message of one of ``types`` or an error."""
    return await client.until(*types, "error")


async def test_chat_limits(limited: Server):
    def chat(messages: int = 1, audio_samples: int = 0) -> dict:
        content: list[dict] = [{"type": "text", "text": "hi"}]
        if audio_samples:
            content.append({"type": "audio", "data": pcm(audio_samples)})
        turns = [{"role": "user", "content": content}] * messages
        return {"messages": turns, "streaming": False}

    async def last(payload: dict) -> dict:
        return (await chat_once(limited, payload))[-1]

    assert (await last(chat(messages=4)))["type"] == "done"
    assert (await last(chat(messages=5)))["code"] == "payload_too_large"
    assert (await last(chat(audio_samples=16_000)))["type"] == "done"
    assert (await last(chat(audio_samples=16_001)))["code"] == "payload_too_large"
    # the size of one message, measured in bytes on the wire
    base = json.dumps({"messages": [{"role": "user", "content": ""}], "generation": {}})
    pad = {"max_new_tokens": 1}
    under = json.dumps({**json.loads(base), "generation": pad, "x": "a" * 10})
    filler = MAX_BYTES - len(under.encode())
    exact = json.dumps({**json.loads(base), "generation": pad, "x": "a" * (10 + filler)})
    assert len(exact.encode()) == MAX_BYTES
    async with connect(f"{limited.ws}/ws/chat", max_size=None) as ws:
        await ws.send(exact)
        assert json.loads(await ws.recv()).get("code") != "payload_too_large"
    async with connect(f"{limited.ws}/ws/chat", max_size=None) as ws:
        await ws.send(exact + " ")
        assert json.loads(await ws.recv())["code"] == "payload_too_large"


async def test_duplex_and_half_duplex_limits(limited: Server):
    client = await open_client(limited, path="/ws/duplex", query="?mode=omni")
    await client.until("queue_done")
    over_prepare = {"type": "prepare", "ref_audio_base64": pcm(16_001)}
    await client.send(over_prepare)
    assert (await answer(client, "prepared"))["code"] == "payload_too_large"
    await client.send(
        {**over_prepare, "system_prompt": "#schedule:L", "ref_audio_base64": pcm(16_000)}
    )
    assert (await answer(client, "prepared"))["type"] == "prepared"

    async def chunk(samples: int = 16_000, frames: int = 0, frame: bytes = FRAME) -> dict:
        message = {"type": "audio_chunk", "audio_base64": pcm(samples)}
        if frames:
            message["frame_base64_list"] = [b64(frame)] * frames
        await client.send(message)
        return await answer(client, "result")

    assert (await chunk(samples=32_000))["type"] == "result"
    assert (await chunk(samples=32_001))["code"] == "payload_too_large"
    assert (await chunk(frames=2))["type"] == "result"
    assert (await chunk(frames=3))["code"] == "payload_too_large"
    assert (await chunk(frames=1, frame=FRAME + b"\0"))["code"] == "payload_too_large"
    await client.send({"type": "pause", "timeout": 100})
    assert (await answer(client, "paused"))["timeout"] == 3  # capped, not refused
    await client.ws.close()

    half = await open_client(limited)
    prepared = await half.prepare(config={"session": {"timeout_s": 10**6}})
    assert prepared["timeout_s"] == 5  # capped
    await half.send({"type": "audio_chunk", "audio_base64": pcm(32_001)})
    assert (await answer(half, "vad_state"))["code"] == "payload_too_large"
    await half.send({"type": "audio_chunk", "audio_base64": pcm(32_000)})
    await half.send({"type": "stop"})
    assert (await half.until("stopped", "error"))["type"] == "stopped"


async def test_queue_capacity(limited: Server):
    holder = await open_client(limited, path="/ws/duplex", query="?mode=audio")
    await holder.prepare("#schedule:L")
    waiting = await open_client(limited, path="/ws/duplex", query="?mode=audio")
    assert (await waiting.recv())["type"] == "queued"  # the last place
    refused = await open_client(limited, path="/ws/duplex", query="?mode=audio")
    assert (await refused.recv())["code"] == "queue_full"
    await refused.ws.wait_closed()
    assert refused.ws.close_code == 1013


def test_check_message_sizes_without_decoding():
    limits = LimitSettings(max_chunk_audio_s=1, max_frames_per_chunk=1, max_frame_bytes=10,
                           max_prepare_audio_s=0.5)  # fmt: skip

    def refused(message: dict) -> bool:
        parsed = half_duplex_message if "system_content" in message else duplex_message
        try:
            check_message(parsed.validate_python(message), limits)
        except ProtocolError as exc:
            assert exc.code is ErrorCode.PAYLOAD_TOO_LARGE
            return True
        return False

    chunk = {"type": "audio_chunk", "audio_base64": pcm(16_000)}
    assert not refused(chunk)
    assert refused({**chunk, "audio_base64": pcm(16_001)})
    assert not refused({**chunk, "frame_base64_list": [b64(b"x" * 10)]})
    assert refused({**chunk, "frame_base64_list": [b64(b"x" * 11)]})
    assert refused({**chunk, "frame_base64_list": [b64(b"x")] * 2})
    prepare = {
        "type": "prepare",
        "ref_audio_base64": pcm(4_000),
        "tts_ref_audio_base64": pcm(4_000),
    }
    assert not refused(prepare)
    assert refused({**prepare, "tts_ref_audio_base64": pcm(4_001)})
    system = [{"type": "audio", "data": pcm(8_000)}, {"type": "text", "text": "hi"}]
    assert not refused({"type": "prepare", "system_content": system})
    assert refused({"type": "prepare", "system_content": [*system, system[0]]})


def test_key_limiter_rate_and_sessions():
    now = [0.0]
    limiter = KeyLimiter(requests_per_minute=3, max_sessions=2, clock=lambda: now[0])
    alice = Principal("a", "alice", Role.USER)
    bob = Principal("b", "bob", Role.USER, requests_per_minute=0, max_sessions=1)
    assert [limiter.request(alice) for _ in range(3)] == [None] * 3
    over = limiter.request(alice)
    assert over is not None and over.code is ErrorCode.RATE_LIMITED and over.retry_after_s == 20
    now[0] = 20.0  # one request's worth refilled
    assert limiter.request(alice) is None and limiter.request(alice) is not None
    assert all(limiter.request(bob) is None for _ in range(100))  # 0: no limit
    assert limiter.open_session(alice) is None and limiter.open_session(alice) is None
    refusal = limiter.open_session(alice)
    assert refusal is not None and refusal.code is ErrorCode.TOO_MANY_SESSIONS
    limiter.close_session(alice)
    assert limiter.open_session(alice) is None
    assert limiter.open_session(bob) is None and limiter.open_session(bob) is not None
    limiter.close_session(bob)
    assert limiter.sessions_of(bob) == 0

"""Conformance of ``/v1/realtime`` with the newer dialect (spec/realtime-v2.md),
through real processes on the scripted engine: the public SDK as a client,
and the protocol frame by frame (events, fields, state rules, close reasons
and codes, chat mode, subprotocols and keys)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from openbmb_realtime import AudioDelta, RealtimeClient, SessionClosed, TextDelta, UsageEvent
from PIL import Image
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.clients import EventSocket, owned_task
from tests.servers import Server

pytestmark = pytest.mark.shared_server

SECOND_F32 = (np.zeros(16000, "<f4") + 0.01).tobytes()
SECOND = base64.b64encode(SECOND_F32).decode()
KEY = "v2-test-key-0123456789abcdef"


def jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), (0, 120, 0)).save(buffer, "JPEG")
    return buffer.getvalue()


class V2(EventSocket):
    """A raw client of the newer dialect."""

    async def init(self, **payload: Any) -> dict[str, Any]:
        await self.until("session.queue_done")
        await self.send({"type": "session.init", "payload": payload})
        return await self.until("session.created")

    async def append(self, **fields: Any) -> None:
        await self.send({"type": "input.append", "input": {"audio": SECOND, **fields}})

    async def deltas_until_listen(self, timeout: float = 10) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        while not got or got[-1]["kind"] != "listen":
            event = await self.until("response.output.delta", timeout=timeout)
            got.append(event)
        return got

    async def closed(self, timeout: float = 10) -> tuple[dict[str, Any], int | None]:
        event = await self.until("session.closed", timeout=timeout)
        await asyncio.wait_for(self.ws.wait_closed(), timeout)
        return event, self.ws.close_code


async def v2(server: Server, mode: str = "audio", **kwargs: Any) -> V2:
    url = f"{server.ws}/v1/realtime?mode={mode}&model=minicpm-o-4.5-realtime"
    return V2(await connect(url, max_size=None, **kwargs))


# --- the public SDK --------------------------------------------------------------------


async def events_until_audio(session: Any, sending: Any, deltas: int = 2) -> list[Any]:
    """The SDK's events while ``sending`` runs, until ``deltas`` audio deltas came."""
    events: list[Any] = []
    async with owned_task(sending, "sender") as sender:
        async with asyncio.timeout(20):
            async for event in session:
                events.append(event)
                if sum(isinstance(e, AudioDelta) for e in events) >= deltas:
                    break
        await sender
    return events


async def test_the_public_sdk_talks_audio(server: Server):
    client = RealtimeClient(api_key="any-key-on-an-open-gateway", base_url=server.http)
    session = await client.audio.connect(model="minicpm-o-4.5-realtime",
                                         system_prompt="#schedule:LSE")  # fmt: skip
    assert session.id.startswith("rt_")

    async def speak() -> None:
        for _ in range(4):  # 100 ms pieces, as a microphone gives them
            for start in range(0, len(SECOND_F32), 6400):
                await session.send_audio(SECOND_F32[start : start + 6400])
                await asyncio.sleep(0.02)

    events = await events_until_audio(session, speak())
    texts = [e.text for e in events if isinstance(e, TextDelta)]
    assert texts[:2] == ["unit 1 rms 0.010 frames 0 ", "unit 2 rms 0.010 frames 0 "]
    audio = [e.audio for e in events if isinstance(e, AudioDelta)]
    assert all(len(a) % 4 == 0 and a for a in audio)
    assert any(isinstance(e, UsageEvent) for e in events)
    assert session.usage is not None and session.usage.prompt_tokens > 0
    assert session.usage.audio_input_tokens and session.usage.audio_output_tokens
    await session.close()
    assert session.state.value == "closed"
    assert [e.reason for e in events if isinstance(e, SessionClosed)] in ([], ["user_stop"])


async def test_the_public_sdk_talks_video(server: Server):
    client = RealtimeClient(api_key="k", base_url=f"{server.http}/v1")
    session = await client.video.connect(model="m", system_prompt="#schedule:S")

    async def watch() -> None:
        for _ in range(3):
            await session.send_audio_video(SECOND_F32, jpeg())
            await asyncio.sleep(0.3)

    events = await events_until_audio(session, watch())
    texts = [e.text for e in events if isinstance(e, TextDelta)]
    assert texts and all("frames 1" in text for text in texts)  # each unit saw its frame
    assert session.usage is not None and session.usage.vision_input_tokens
    await session.close()
    assert session.state.value == "closed"


# --- frame by frame -------------------------------------------------------------------------


async def test_a_spoken_turn_frame_by_frame(server: Server):
    rt = await v2(server, subprotocols=["map.realtime"])
    assert rt.ws.subprotocol == "map.realtime"
    created = await rt.init(instructions="#schedule:LSE", config={"length_penalty": 1.1})
    assert created["mode"] == "full_duplex" and created["session_id"].startswith("rt_")
    assert created["usage"]["input_tokens"] > 0 and isinstance(created["server_send_ts"], float)
    for n in range(3):
        await rt.append(input_id=f"in-{n}")
    listen = await rt.until("response.output.delta")
    assert listen["kind"] == "listen" and listen["input_id"] == "in-0"
    assert listen["chunk_index"] == 0 and listen["metrics"]["kv_cache_length"] > 0
    turn = await rt.deltas_until_listen()
    kinds = [d["kind"] for d in turn]
    assert kinds == ["text", "audio", "text", "audio", "listen"]
    assert len({d["response_id"] for d in turn}) == 1 and turn[0]["response_id"].startswith("resp_")
    assert [d["input_id"] for d in turn] == ["in-1", "in-1", "in-2", "in-2", "in-2"]
    assert all(("text" in d) == (d["kind"] == "text") for d in turn)  # one kind per frame
    assert all(("audio" in d) == (d["kind"] == "audio") for d in turn)
    assert [d["chunk_index"] for d in turn] == [1, 1, 2, 2, 2]  # every delta of a step
    total = turn[-1]["usage"]
    assert total["total_tokens"] == total["input_tokens"] + total["output_tokens"]
    assert total["output_token_details"]["audio_tokens"] > 0
    await rt.send({"type": "session.close", "reason": "user_stop"})
    closed, code = await rt.closed()
    assert closed["reason"] == "user_stop" and code == 1000 and "usage" in closed


@pytest.mark.parametrize(
    ("active", "event", "diagnostic"),
    [
        (False, {"type": "input.append", "input": {"audio": SECOND}}, "before session.created"),
        (False, {"type": "session.init", "payload": "x"}, "payload"),
        (True, {"type": "session.init", "payload": {}}, "once"),
        (True, {"type": "input.append", "input": {"audio": "!!"}}, "audio"),
        (True, {"type": "input.append", "input": {}}, "audio"),
        (True, {"type": "response.create"}, "unknown event"),
    ],
)
async def test_violations_are_fatal(server: Server, active: bool, event: dict, diagnostic: str):
    rt = await v2(server)
    if active:
        await rt.init()
    else:
        await rt.until("session.queue_done")
    await rt.send(event)
    closed, code = await rt.closed()
    assert closed["reason"] == "backend_error" and diagnostic in closed["diagnostic"]["message"]
    assert code == 1011
    await server.wait_worker_status("idle")


async def test_an_init_sent_while_queued_is_kept(server: Server):
    holder = await v2(server)
    await holder.init()
    waiting = await v2(server)
    assert (await waiting.recv())["type"] == "session.queued"
    await waiting.send({"type": "session.init", "payload": {"system_prompt": "#schedule:S"}})
    await holder.send({"type": "session.close"})
    await holder.closed()
    await waiting.until("session.created")
    await waiting.append()
    assert (await waiting.until("response.output.delta"))["kind"] == "text"


async def test_an_engine_failure_is_fatal(server: Server):
    rt = await v2(server)
    await rt.init(system_prompt="#fail-unit:1 #schedule:L")
    await rt.append()
    await rt.append()
    closed, code = await rt.closed()
    assert closed["reason"] == "backend_error" and "unit 1" in closed["diagnostic"]["message"]
    assert code == 1011


async def test_raw_pcm_and_wav_voices(server: Server):
    pcm = base64.b64encode(np.zeros(8000, "<f4").tobytes()).decode()
    rt = await v2(server)
    await rt.init(system_prompt="#schedule:S", voice={"ref_audio": pcm})
    await rt.append()
    assert "voice: 0.50 s reference" in (await rt.until("response.output.delta"))["text"]


@pytest.fixture
async def short_server(tmp_path: Path) -> AsyncIterator[Server]:
    env = {"OMNILIVE_REALTIME__AUDIO_MAX_S": "3", "OMNILIVE_REALTIME__CHAT_IDLE_S": "1.5"}
    srv = Server(tmp_path, env=env).start()
    try:
        await srv.wait_ready(workers=1)
        yield srv
    finally:
        srv.stop()


async def test_the_time_limit_is_a_timeout_close(short_server: Server):
    rt = await v2(short_server)
    await rt.init(system_prompt="#schedule:L")
    closed, code = await rt.closed(timeout=6)
    assert closed["reason"] == "timeout" and code == 1000


# --- chat over the socket -----------------------------------------------------------------


def question(text: str, **fields: Any) -> dict[str, Any]:
    turn = {"messages": [{"role": "user", "content": text}], **fields}
    return {"type": "input.append", "input": turn}


async def test_chat_streaming_and_not(server: Server):
    rt = await v2(server, mode="chat")
    created = await rt.init()
    assert created["mode"] == "turn_based"
    await rt.send(question("Hello there", input_id="q1"))
    await rt.send(question("Again", input_id="q2", streaming=False, tts={"enabled": True}))
    first = await rt.until("response.done")
    streamed = [e for e in rt.events if e["type"] == "response.output.delta"]
    assert streamed and all(d["kind"] == "text" and d["input_id"] == "q1" for d in streamed)
    assert "".join(d["text"] for d in streamed) == first["text"] == "You said: Hello there"
    assert first["reason"] == "turn_end" and first["input_id"] == "q1" and "audio" not in first
    assert first["usage"]["input_tokens"] > 0 and first["chunk_index"] == 0
    before = len(rt.events)
    second = await rt.until("response.done")
    assert [e["type"] for e in rt.events[before:]] == ["response.done"]  # not streamed
    assert second["input_id"] == "q2" and second["audio"]  # spoken, in full
    assert second["response_id"] != first["response_id"]
    await rt.send({"type": "session.close", "reason": "turn_done"})
    closed, code = await rt.closed()
    assert closed["reason"] == "turn_done" and code == 1000
    await server.wait_worker_status("idle")


async def test_chat_violations_are_fatal_and_free_the_worker(server: Server):
    rt = await v2(server, mode="chat")
    await rt.init()
    await rt.send({"type": "input.append", "input": {"messages": []}})
    closed, code = await rt.closed()
    assert closed["reason"] == "backend_error" and code == 1011
    await server.wait_worker_status("idle")


async def test_an_idle_chat_session_ends(short_server: Server):
    rt = await v2(short_server, mode="chat")
    await rt.init()
    closed, code = await rt.closed(timeout=6)
    assert closed["reason"] == "timeout" and code == 1000


# --- keys ----------------------------------------------------------------------------------


@pytest.fixture
async def keyed_server(tmp_path: Path) -> AsyncIterator[Server]:
    keys = json.dumps([{"key": KEY, "role": "user"}])
    srv = Server(tmp_path, env={"OMNILIVE_AUTH__KEYS": keys}, api_key=KEY).start()
    try:
        await srv.wait_ready(workers=1)
        yield srv
    finally:
        srv.stop()


async def test_a_key_as_subprotocol_or_header(keyed_server: Server):
    """Browser clients offer map.realtime plus map-api-key.<key>; the SDK a header."""
    browser = await v2(keyed_server, subprotocols=["map.realtime", f"map-api-key.{KEY}"])
    assert browser.ws.subprotocol == "map.realtime"
    await browser.init()
    await browser.send({"type": "session.close"})
    await browser.closed()
    with pytest.raises(InvalidStatus) as refused:
        await v2(keyed_server, subprotocols=["map.realtime", "map-api-key.wrong-key-123456789"])
    assert refused.value.response.status_code == 401
    client = RealtimeClient(api_key=KEY, base_url=keyed_server.http)
    session = await client.audio.connect(model="m")
    await session.close()

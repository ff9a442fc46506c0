"""Stored voices used by id in every mode, and app switches, through real
processes on the scripted engine (whose answers describe the voice it got)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from omnilive.audio import INPUT_RATE, tone
from tests.audio_files import encoded
from tests.clients import Client, open_client
from tests.integration.test_duplex import SECOND, duplex, results
from tests.integration.test_half_duplex import utterance
from tests.integration.test_realtime import Rt
from tests.servers import Server, chat_once, user


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for the tests that leave it as they found it."""
    server = Server(tmp_path_factory.mktemp("voices")).start()
    try:
        asyncio.run(server.wait_ready(workers=1))
        yield server
    finally:
        server.stop()


async def store(server: Server, seconds: float, name: str = "v") -> str:
    data = encoded(tone(seconds, INPUT_RATE, 220), "wav")
    async with httpx.AsyncClient() as http:
        response = await http.post(
            f"{server.http}/api/assets/ref_audio", files={"file": ("v.wav", data)},
            data={"name": name}, timeout=30,
        )  # fmt: skip
    assert response.status_code == 201, response.text
    return response.json()["id"]


async def switch(server: Server, app_id: str, enabled: bool) -> None:
    async with httpx.AsyncClient() as http:
        response = await http.put(
            f"{server.http}/api/admin/apps/{app_id}", json={"enabled": enabled}
        )
    assert response.status_code == 200 and response.json()["enabled"] is enabled


def pcm_b64(seconds: float) -> str:
    return base64.b64encode(tone(seconds, INPUT_RATE, 200).astype("<f4").tobytes()).decode()


async def test_chat_speaks_with_a_stored_voice(shared: Server):
    voice_id = await store(shared, 1.0)
    done = (await chat_once(shared, user("hi", tts={"ref_audio_id": voice_id})))[-1]
    assert done["type"] == "done" and "(voice: 1.00 s reference)" in done["text"]
    assert done["warnings"] == []
    # explicit audio wins over an id
    both = {"ref_audio_id": voice_id, "ref_audio_data": pcm_b64(0.75)}
    done = (await chat_once(shared, user("hi", tts=both)))[-1]
    assert "(voice: 0.75 s reference)" in done["text"]
    async with httpx.AsyncClient() as http:
        response = await http.post(
            f"{shared.http}/api/chat", json=user("hi", tts={"ref_audio_id": voice_id}), timeout=30
        )
    assert response.status_code == 200 and "(voice: 1.00 s reference)" in response.json()["text"]


async def test_chat_refuses_unknown_and_malformed_voice_ids(shared: Server):
    for voice_id, where in (("voice_missing123", "unknown reference voice"), ("../x", "tts")):
        error = (await chat_once(shared, user("hi", tts={"ref_audio_id": voice_id})))[-1]
        assert error["type"] == "error" and error["code"] == "invalid_request", error
        assert where in error["error"]


async def test_duplex_uses_stored_voices_for_the_model_and_the_speech(shared: Server):
    one, two = await store(shared, 1.0), await store(shared, 2.0)
    client = await duplex(shared)
    await client.until("queue_done")
    await client.send(
        {"type": "prepare", "system_prompt": "#schedule:S", "ref_audio_id": "voice_gone"}
    )
    error = await client.until("error")
    assert error["code"] == "invalid_request" and "voice_gone" in error["error"]
    await client.send({"type": "prepare", "system_prompt": "#schedule:S", "ref_audio_id": one})
    prepared = await client.until("prepared")
    assert prepared["warnings"] == []
    await client.chunk(SECOND)
    assert "(voice: 1.00 s reference)" in (await results(client, 1))[0]["text"]
    await client.send({"type": "stop"})
    await client.until("stopped")
    other = await duplex(shared)
    await other.prepare("#schedule:S", ref_audio_id=one, tts_ref_audio_id=two)
    await other.chunk(SECOND)
    assert "(voice: 2.00 s reference)" in (await results(other, 1))[0]["text"]


async def test_half_duplex_answers_with_a_stored_voice(shared: Server):
    voice_id = await store(shared, 1.0)
    client = await open_client(shared)
    await client.until("queue_done")
    await client.send({"type": "prepare", "ref_audio_id": "voice_gone"})
    assert (await client.until("error"))["code"] == "invalid_request"
    await client.send({"type": "prepare", "ref_audio_id": voice_id})
    prepared = await client.until("prepared")
    assert prepared["warnings"] == []
    await client.speak(utterance("Hello there."))
    done = await client.until("turn_done")
    assert "(voice: 1.00 s reference)" in done["text"]


async def test_realtime_takes_stored_voices(shared: Server):
    voice_id = await store(shared, 1.0)
    async with connect(f"{shared.ws}/v1/realtime?mode=audio", max_size=None) as ws:
        rt = Rt(ws)
        await rt.until("session.queue_done")
        update = {"instructions": "#schedule:E", "ref_audio_id": "voice_gone"}
        await rt.send({"type": "session.update", "session": update})
        error = await rt.until("error")
        assert (
            error["error"]["code"] == "invalid_payload"
            and "voice_gone" in error["error"]["message"]
        )
        await rt.send({"type": "session.update", "session": {**update, "ref_audio_id": voice_id}})
        await rt.until("session.created")
        await rt.append(frames=False)
        delta = await rt.until("response.output_audio.delta")
        assert "(voice: 1.00 s reference)" in delta["text"]


async def test_a_deleted_voice_is_unknown_to_new_sessions(shared: Server):
    voice_id = await store(shared, 1.0)
    async with httpx.AsyncClient() as http:
        response = await http.delete(f"{shared.http}/api/assets/ref_audio/{voice_id}")
    assert response.status_code == 200
    error = (await chat_once(shared, user("hi", tts={"ref_audio_id": voice_id})))[-1]
    assert error["code"] == "invalid_request"


async def closed_with(client: Client) -> tuple[dict, int | None]:
    error = await client.until("error")
    with pytest.raises(ConnectionClosed):
        await client.recv(timeout=10)
    return error, client.ws.close_code


async def test_duplex_prepare_cannot_switch_to_a_disabled_mode(shared: Server):
    await switch(shared, "audio_duplex", False)
    try:
        holder = await duplex(shared, "?mode=omni")  # keeps the only worker busy
        await holder.prepare()
        queued = await duplex(shared, "?mode=omni")
        await queued.until("queued")
        await queued.send({"type": "prepare", "system_prompt": "x", "mode": "audio_duplex"})
        error, code = await closed_with(queued)
        assert error["code"] == "app_disabled" and code == 1008
        await holder.send({"type": "prepare", "system_prompt": "x", "mode": "audio_duplex"})
        error, code = await closed_with(holder)
        assert error["code"] == "app_disabled" and code == 1008
        status = await shared.get("/status")
        assert status["queue_length"] == 0
    finally:
        await switch(shared, "audio_duplex", True)


async def test_app_switches_survive_a_restart(tmp_path: Path):
    first = Server(tmp_path).start()
    try:
        await first.wait_ready(workers=1)
        await switch(first, "half_duplex", False)
        await switch(first, "turnbased", False)
    finally:
        first.stop()
    again = Server(tmp_path).start()  # same data dir, new ports
    try:
        await again.wait_ready(workers=1)
        listed = [app["id"] for app in (await again.get("/api/apps"))["apps"]]
        assert listed == ["audio_duplex", "omni", "realtime"]
        client = await open_client(again)
        error, code = await closed_with(client)
        assert error["code"] == "app_disabled" and code == 1008
        async with httpx.AsyncClient() as http:
            response = await http.post(f"{again.http}/api/chat", json=user("hi"))
        assert response.status_code == 403 and response.json()["code"] == "app_disabled"
        async with connect(f"{again.ws}/ws/chat") as ws:
            assert json.loads(await ws.recv())["code"] == "app_disabled"
            with pytest.raises(ConnectionClosed):
                await ws.recv()
            assert ws.close_code == 1008
    finally:
        again.stop()

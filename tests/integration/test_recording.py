"""Sessions recorded through real gateway and worker processes (scripted
engine): what lands on disk, what the session API serves, and what is left
when the worker is killed mid-session."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
from typing import Any

import httpx
import numpy as np
import pytest
from websockets.asyncio.client import connect

from omnilive.audio import tone
from tests.clients import open_client
from tests.integration.test_half_duplex import utterance
from tests.recordings import load, meta_when, png, recording_dir, wav_seconds
from tests.servers import Server, chat_once, user


def b64(samples: np.ndarray) -> str:
    return base64.b64encode(samples.astype("<f4").tobytes()).decode()


def chunk_seconds(messages: list[dict[str, Any]]) -> float:
    """Seconds of 24 kHz audio the client received in ``chunk`` messages."""
    samples = sum(
        len(base64.b64decode(m["audio_data"])) // 4
        for m in messages
        if m["type"] == "chunk" and m.get("audio_data")
    )
    return samples / 24_000


async def test_chat_session_is_recorded_and_served(server: Server):
    question = tone(0.5, 16_000, 440)
    content = [
        {"type": "text", "text": "describe these"},
        {"type": "audio", "data": b64(question)},
        {"type": "image", "data": base64.b64encode(png()).decode()},
    ]
    request = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": content},
        ]
    }
    messages = await chat_once(server, request)
    done = messages[-1]
    recording_id = done["recording_session_id"]
    assert done["type"] == "done" and recording_id.startswith("chat_")

    meta = await meta_when(server, recording_id, "ended")
    assert meta["app_type"] == "chat" and meta["worker_id"] == "w0"
    assert meta["title"].startswith("describe these") and meta["duration_s"] > 0
    assert meta["config"]["generation"]["max_new_tokens"] == 512 and meta["counts"] == {"turns": 1}
    directory = recording_dir(server, recording_id)
    doc = load(directory / "recording.json")
    assert doc["session_id"] == recording_id and doc["mode"] == "chat"
    (turn,) = doc["turns"]
    assert turn["status"] == "done" and turn["timing"]["total_ms"] > 0
    system, asked = turn["input"]["messages"]
    assert system == {"role": "system", "content": [{"type": "text", "text": "be brief"}]}
    _, audio, image = asked["content"]
    assert audio["duration_ms"] == 500.0
    assert wav_seconds(directory / audio["file"]) == pytest.approx(0.5)
    assert (directory / image["file"]).read_bytes() == png()
    output = turn["output"]
    assert output["text"] == done["text"]
    received = chunk_seconds(messages)
    assert output["audio_duration_ms"] == pytest.approx(received * 1000, abs=1)
    assert wav_seconds(directory / output["audio"]) == pytest.approx(received, abs=0.001)
    assert {"merged_replay.wav"} <= set(meta["replays"])

    async with httpx.AsyncClient(base_url=server.http) as client:
        served = (await client.get(f"/api/sessions/{recording_id}/recording")).json()
        assert served == doc
        wav = await client.get(f"/api/sessions/{recording_id}/assets/{output['audio']}")
        assert wav.content == (directory / output["audio"]).read_bytes()
        traversal = await client.get(f"/api/sessions/{recording_id}/assets/..%2F..%2Fserver.log")
        assert traversal.status_code == 404
        async with client.stream("GET", f"/api/sessions/{recording_id}/download") as zipped:
            assert zipped.headers.get("transfer-encoding") == "chunked"
            assert len(b"".join([piece async for piece in zipped.aiter_raw()])) > 0
        assert (await client.get(f"/s/{recording_id}")).status_code == 200

    opted_out = await chat_once(server, user("not this one", recording=False))
    assert opted_out[-1]["type"] == "done" and opted_out[-1]["recording_session_id"] is None
    assert len(list((server.tmp / "data" / "sessions").iterdir())) == 1


async def test_half_duplex_session_is_recorded(server: Server):
    client = await open_client(server)
    prepared = await client.prepare("Answer briefly.")
    recording_id = prepared["recording_session_id"]
    assert recording_id.startswith("hd_") and recording_id != client.session_id
    await client.speak(utterance())
    done = await client.until("turn_done")
    await client.send({"type": "stop"})
    await client.until("stopped")
    await client.ws.close()
    generating = next(m for m in client.received if m["type"] == "generating")

    meta = await meta_when(server, recording_id, "ended")
    assert meta["app_type"] == "half_duplex" and meta["client_session_id"] == client.session_id
    assert meta["config"]["system_prompt"] == "Answer briefly."
    assert meta["config"]["vad"]["min_silence_duration_ms"] == 800
    directory = recording_dir(server, recording_id)
    (turn,) = load(directory / "recording.json")["turns"]
    assert turn["status"] == "done" and turn["output"]["text"] == done["text"]
    source = turn["input"]
    heard = wav_seconds(directory / source["user_audio"])
    assert heard * 1000 == pytest.approx(source["user_audio_duration_ms"], abs=1)
    # the segment is the speech plus its padding on both sides (30 ms each)
    assert heard * 1000 == pytest.approx(generating["speech_duration_ms"] + 60, abs=100)
    received = chunk_seconds(client.received)
    assert wav_seconds(directory / turn["output"]["audio"]) == pytest.approx(received, abs=0.001)
    assert turn["timing"]["total_ms"] > 0 and "merged_replay.wav" in meta["replays"]

    quiet = await open_client(server)
    await quiet.until("queue_done")
    await quiet.send({"type": "prepare", "system_prompt": "hi", "recording": False})
    assert (await quiet.until("prepared"))["recording_session_id"] is None
    await quiet.ws.close()


async def test_killed_worker_leaves_a_valid_recording_marked_abnormal(server: Server):
    client = await open_client(server)
    # Slow steps, and the worker's pid asked for before the second answer
    # starts: the kill must land while that answer is under way, even on a
    # loaded machine.
    recording_id = (await client.prepare("slow #latency:0.4"))["recording_session_id"]
    await client.speak(utterance())
    first = await client.until("turn_done")
    pid = (await server.get("/workers"))["workers"][0]["pid"]
    await client.speak(utterance())
    await client.until("chunk")  # the second answer is under way
    os.kill(pid, signal.SIGKILL)
    assert (await client.until("error"))["code"] == "worker_failed"

    meta = await meta_when(server, recording_id, "abnormal")
    assert meta["ended_at"] and meta["counts"] == {"turns": 1}
    doc = json.loads((recording_dir(server, recording_id) / "recording.json").read_bytes())
    (turn,) = doc["turns"]  # every turn completed before the kill, nothing after
    assert turn["status"] == "done" and turn["output"]["text"] == first["text"]
    assert "merged_replay.wav" in meta["replays"]

    # A chat request cut by a kill: its recording is closed as abnormal too.
    await server.wait_ready(workers=1, timeout=30)
    pid = (await server.get("/workers"))["workers"][0]["pid"]
    async with connect(f"{server.ws}/ws/chat") as ws:
        await ws.send(json.dumps(user("a slow answer #latency:0.5")))
        assert json.loads(await ws.recv())["type"] == "prefill_done"
        os.kill(pid, signal.SIGKILL)
        async with asyncio.timeout(5):
            rest = [json.loads(raw) async for raw in ws]
    assert rest[-1]["code"] == "worker_failed"
    chats = [
        p.name for p in (server.tmp / "data" / "sessions").iterdir() if p.name.startswith("chat_")
    ]
    (chat_id,) = chats
    meta = await meta_when(server, chat_id, "abnormal")
    assert load(recording_dir(server, chat_id) / "recording.json")["turns"] == []

"""Duplex and realtime sessions are recorded unit by unit, replayable, and
survive a killed worker (scripted engine, real processes)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal

import numpy as np
import pytest
from websockets.asyncio.client import connect

from tests.clients import open_client
from tests.recordings import ffprobe, jpeg, load, meta_when, recording_dir, wav_seconds
from tests.servers import Server

pytestmark = pytest.mark.shared_server


def b64(samples: np.ndarray) -> str:
    return base64.b64encode(samples.astype("<f4").tobytes()).decode()


def received_seconds(result: dict) -> float:
    return len(base64.b64decode(result["audio_data"])) / 4 / 24000 if result["audio_data"] else 0


@pytest.mark.parametrize("mode", ["audio", "omni"])
async def test_duplex_session_is_recorded_unit_by_unit(server: Server, mode: str):
    client = await open_client(server, path="/ws/duplex", query=f"?mode={mode}")
    prepared = await client.prepare("#schedule:LSE")
    recording_id = prepared["recording_session_id"]
    assert recording_id and recording_id != client.session_id
    results = []
    for index in range(6):  # half-second chunks at real-time pace: a 3 s session
        fields = {"frame_base64_list": [base64.b64encode(jpeg((40 * index, 0, 0))).decode()]}
        await client.chunk(np.full(8000, 0.01 * (index + 1), np.float32), **fields)
        results.append(await client.until("result"))
        await asyncio.sleep(0.5)
    await client.send({"type": "stop"})
    await client.until("stopped")

    meta = await meta_when(server, recording_id, "ended")
    assert meta["app_type"] == f"{mode}_duplex"
    directory = recording_dir(server, recording_id)
    chunks = load(directory / "recording.json")["chunks"]
    assert [c["index"] for c in chunks] == [r["unit_index"] for r in results]
    for chunk, result in zip(chunks, results, strict=True):
        assert wav_seconds(directory / chunk["user_audio"]) == pytest.approx(0.5, abs=1e-3)
        assert chunk["result"]["mode"] == ("LISTEN" if result["is_listen"] else "SPEAK")
        assert chunk["result"]["text"] == result["text"]
        assert chunk["result"]["end_of_turn"] == result["end_of_turn"]
        assert chunk["dropped_before"] == result["dropped_chunks"]
        if result["audio_data"]:
            ai = wav_seconds(directory / chunk["result"]["ai_audio"])
            assert ai == pytest.approx(received_seconds(result), abs=1e-3)
        if mode == "omni":
            assert (directory / chunk["user_frame"]).read_bytes()[:2] == b"\xff\xd8"
    assert "merged_replay.wav" in meta["replays"]
    if mode == "omni":
        assert "merged_replay.mp4" in meta["replays"]
        probe = ffprobe(directory / "merged_replay.mp4")
        kinds = {s["codec_type"] for s in probe["streams"]}
        assert {"video", "audio"} <= kinds
        replay_s = wav_seconds(directory / "merged_replay.wav")
        assert replay_s >= 3.0  # the session's real length, not the audio laid end to end
        for stream in probe["streams"]:
            if stream["codec_type"] in ("video", "audio"):
                assert float(stream["duration"]) == pytest.approx(replay_s, abs=0.25), stream


async def test_realtime_session_is_recorded(server: Server):
    async with connect(f"{server.ws}/v1/realtime?mode=audio") as ws:

        async def until(kind: str) -> dict:
            while (event := json.loads(await ws.recv()))["type"] != kind:
                pass
            return event

        await until("session.queue_done")
        update = {"type": "session.update", "session": {"instructions": "#schedule:LS"}}
        await ws.send(json.dumps(update))
        recording_id = (await until("session.created"))["recording_session_id"]
        for _ in range(4):
            await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                      "audio": b64(np.zeros(16000, np.float32))}))  # fmt: skip
            await ws.recv()
        await ws.send(json.dumps({"type": "session.close"}))
        await until("session.closed")
    meta = await meta_when(server, recording_id, "ended")
    assert meta["app_type"] == "realtime"
    chunks = load(recording_dir(server, recording_id) / "recording.json")["chunks"]
    assert [c["result"]["mode"] for c in chunks] == ["LISTEN", "SPEAK", "LISTEN", "SPEAK"]


@pytest.mark.fresh_server
async def test_killed_worker_mid_duplex_leaves_every_completed_unit(server: Server):
    client = await open_client(server, path="/ws/duplex", query="?mode=audio")
    recording_id = (await client.prepare("#schedule:LS #latency:0.3"))["recording_session_id"]
    for _ in range(3):
        await client.chunk(np.zeros(16000, np.float32))
        await client.until("result")
    await client.chunk(np.zeros(16000, np.float32))  # in flight when the worker dies
    pid = (await server.get("/workers"))["workers"][0]["pid"]
    os.kill(pid, signal.SIGKILL)
    assert (await client.until("error"))["code"] == "worker_failed"
    meta = await meta_when(server, recording_id, "abnormal")
    doc = json.loads((recording_dir(server, recording_id) / "recording.json").read_bytes())
    assert [c["index"] for c in doc["chunks"]][:3] == [0, 1, 2]
    assert meta["ended_at"] and "merged_replay.wav" in meta["replays"]


@pytest.mark.fresh_server  # it finds no recording at all
async def test_opting_out_writes_nothing(server: Server):
    client = await open_client(server, path="/ws/duplex", query="?mode=audio")
    prepared = await client.prepare("#schedule:L", recording=False)
    assert prepared["recording_session_id"] is None
    await client.chunk(np.zeros(16000, np.float32))
    await client.until("result")
    sessions = server.tmp / "data" / "sessions"
    assert not sessions.exists() or not any(sessions.iterdir())

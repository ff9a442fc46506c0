"""Faults with real processes: a worker killed or hung mid-session, a gateway
restarted under its workers, a graceful shutdown. Each checks that the clients
hear about it in their protocol, that the server serves again, and that what
was recorded before the fault is kept."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from tests.clients import open_client
from tests.recordings import load, meta_when, recording_dir
from tests.servers import Server, chat_once, recv, until, user
from tests.speech import silence, speak

SECOND = np.full(16000, 0.01, np.float32)
SECOND_B64 = base64.b64encode(SECOND.astype("<f4").tobytes()).decode()
UTTERANCE = np.concatenate([silence(0.8), speak("What time is it in Paris?"), silence(1.2)])


async def worker_pid(server: Server) -> int:
    return (await server.get("/workers"))["workers"][0]["pid"]


async def chat_ws(server: Server, text: str) -> ClientConnection:
    ws = await connect(f"{server.ws}/ws/chat", max_size=None)
    await ws.send(json.dumps(user(text)))
    return ws


class Session:
    """A session of any mode, driven to the middle of its work."""

    def __init__(self, mode: str, ws: ClientConnection, recording_id: str | None) -> None:
        self.mode = mode
        self.ws = ws
        self.recording_id = recording_id

    async def failure(self) -> dict[str, Any]:
        """The message that tells the client the worker failed."""
        return await until(self.ws, "error", timeout=30)


async def start_session(server: Server, mode: str) -> Session:
    """Open a session of ``mode`` and leave it with work in flight."""
    if mode == "chat":
        ws = await chat_ws(server, "a slow answer #latency:0.4")
        await until(ws, "prefill_done")
        sessions = server.tmp / "data" / "sessions"
        [recording] = [p.name for p in sessions.iterdir() if p.name.startswith("chat_")]
        return Session(mode, ws, recording)
    if mode == "realtime":
        ws = await connect(f"{server.ws}/v1/realtime?mode=audio", max_size=None)
        await until(ws, "session.queue_done")
        update = {"instructions": "#schedule:LS #latency:0.3"}
        await ws.send(json.dumps({"type": "session.update", "session": update}))
        created = await until(ws, "session.created")
        append = json.dumps({"type": "input_audio_buffer.append", "audio": SECOND_B64})
        for _ in range(3):
            await ws.send(append)
            await until(ws, "response.listen", "response.output_audio.delta")
        await ws.send(append)
        return Session(mode, ws, created["recording_session_id"])
    if mode == "half_duplex":
        client = await open_client(server)
        prepared = await client.prepare("#latency:0.3")
        await client.speak(UTTERANCE)
        await client.until("turn_done", timeout=30)
        await client.speak(UTTERANCE)
        await client.until("generating", timeout=30)
        return Session(mode, client.ws, prepared["recording_session_id"])
    client = await open_client(server, path="/ws/duplex", query="?mode=audio")
    prepared = await client.prepare("#schedule:LS #latency:0.3")
    for _ in range(3):
        await client.chunk(SECOND)
        await client.until("result")
    await client.chunk(SECOND)  # in flight at the fault
    return Session(mode, client.ws, prepared["recording_session_id"])


def recorded_units(server: Server, session: Session) -> int:
    assert session.recording_id is not None
    doc = load(recording_dir(server, session.recording_id) / "recording.json")
    return len(doc.get("chunks") or doc.get("turns") or [])


# units (duplex, realtime) or turns (half-duplex) that completed before the fault
DONE_BEFORE = {"chat": 0, "half_duplex": 1, "duplex": 3, "realtime": 3}


@pytest.mark.parametrize("mode", ["chat", "half_duplex", "duplex", "realtime"])
async def test_killed_worker_fails_its_session_fast_and_the_queue_is_served(
    server: Server, mode: str
):
    session = await start_session(server, mode)
    waiting = await chat_ws(server, "I was queued")
    assert (await recv(waiting))["type"] == "queued"
    pid = await worker_pid(server)
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    failure = await session.failure()
    assert time.monotonic() - killed_at < 2.0
    if mode == "realtime":
        assert failure["error"]["code"] == "service_unavailable"
        assert (await until(session.ws, "session.closed"))["reason"] == "error"
    else:
        assert failure["code"] == "worker_failed"
    # the queued client is served by the restarted worker
    assert (await until(waiting, "done", "error", timeout=30))["type"] == "done"
    workers = (await server.get("/workers"))["workers"]
    assert workers[0]["pid"] != pid and workers[0]["restarts"] == 1
    # everything recorded before the kill is still there, and the recording is closed
    assert session.recording_id is not None
    meta = await meta_when(server, session.recording_id, "abnormal")
    assert meta["ended_at"]
    assert recorded_units(server, session) >= DONE_BEFORE[mode]
    await session.ws.close()
    await waiting.close()


async def test_hung_worker_is_detected_killed_and_replaced(server: Server):
    session = await start_session(server, "duplex")
    pid = await worker_pid(server)
    os.kill(pid, signal.SIGSTOP)
    try:
        stopped_at = time.monotonic()
        failure = await session.failure()
        # the control channel's pings: 2 s apart, 5 s to answer, 1 s to close
        assert failure["code"] == "worker_failed" and time.monotonic() - stopped_at < 15
        status = await server.wait_ready(workers=1, timeout=30)
        assert status["workers"]["by_state"] == {"idle": 1}
        workers = (await server.get("/workers"))["workers"]
        assert workers[0]["pid"] != pid and workers[0]["restarts"] == 1
        with pytest.raises(ProcessLookupError):  # the hung process was killed
            for _ in range(50):
                os.kill(pid, 0)
                await asyncio.sleep(0.1)
        assert "does not answer: killing it" in server.full_log()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    meta = await meta_when(server, session.recording_id or "", "abnormal")
    assert meta["ended_at"] and recorded_units(server, session) >= 3
    assert (await chat_once(server, user("after the hang")))[-1]["type"] == "done"


@pytest.fixture
async def worker(tmp_path: Path) -> AsyncIterator[Server]:
    """One ``omnilive worker`` process of its own (no supervisor)."""
    env = {"OMNILIVE_INTERNAL_TOKEN": "shared-secret", "OMNILIVE_SCRIPTED__SLOTS": "2"}
    process = Server(tmp_path, command="worker", workers=0, env=env).start()
    try:
        async with httpx.AsyncClient() as client:
            for _ in range(100):
                with contextlib.suppress(httpx.HTTPError):
                    health = await client.get(
                        f"{process.http}/health",
                        headers={"Authorization": "Bearer shared-secret"},
                        timeout=2,
                    )
                    if health.json().get("worker_status") == "idle":
                        break
                await asyncio.sleep(0.1)
        yield process
    finally:
        process.stop()


def gateway_for(tmp_path: Path, worker: Server) -> Server:
    env = {"OMNILIVE_INTERNAL_TOKEN": "shared-secret"}
    args = ["--worker", worker.http]
    return Server(tmp_path, command="gateway", workers=0, env=env, args=args).start()


async def test_a_restarted_gateway_finds_its_workers_again(tmp_path: Path, worker: Server):
    gateway = gateway_for(tmp_path, worker)
    try:
        await gateway.wait_ready(workers=1)
        session = await start_session(gateway, "duplex")
        gateway.process.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
        gateway.process.wait()  # type: ignore[union-attr]
        with contextlib.suppress(ConnectionClosed, TimeoutError):
            await recv(session.ws, timeout=5)
    finally:
        gateway.stop()
    # the worker ended the orphaned session and closed its recording normally
    data = worker.tmp / "data"
    meta_path = data / "sessions" / (session.recording_id or "") / "meta.json"
    for _ in range(100):
        if meta_path.exists() and load(meta_path)["status"] == "ended":
            break
        await asyncio.sleep(0.1)
    assert load(meta_path)["status"] == "ended"
    doc = load(meta_path.parent / "recording.json")
    assert [c["index"] for c in doc["chunks"]][:3] == [0, 1, 2]
    # a new gateway process, on another port, serves through the same worker
    again = gateway_for(tmp_path, worker)
    try:
        await again.wait_ready(workers=1)
        assert (await chat_once(again, user("hello again")))[-1]["type"] == "done"
    finally:
        again.stop()


async def test_graceful_shutdown_ends_every_session_in_its_protocol(tmp_path: Path):
    server = Server(tmp_path, env={"OMNILIVE_SCRIPTED__SLOTS": "4"}).start()
    try:
        await server.wait_ready(workers=1)
        # the chat last: its whole answer takes only a few seconds
        sessions = [await start_session(server, mode) for mode in
                    ("half_duplex", "duplex", "realtime", "chat")]  # fmt: skip
        server.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        for session in sessions:
            if session.mode == "realtime":
                closed = await until(session.ws, "session.closed", timeout=15)
                assert closed["reason"] == "server_shutdown"
            else:
                try:
                    error = await until(session.ws, "error", timeout=15)
                except ConnectionClosed as exc:
                    raise AssertionError(f"{session.mode} closed without an error") from exc
                assert error["code"] == "server_shutdown", error
            with contextlib.suppress(ConnectionClosed):
                await asyncio.wait_for(session.ws.wait_closed(), 10)
            assert session.ws.close_code in (1000, 1001)
        # uvicorn ends a graceful shutdown by re-raising the signal it handled
        assert server.process.wait(timeout=30) in (0, -signal.SIGTERM)  # type: ignore[union-attr]
    finally:
        server.stop()
    # every recording was finished by its worker before the worker was stopped
    for session in sessions:
        assert session.recording_id is not None
        folder = recording_dir(server, session.recording_id)
        meta = load(folder / "meta.json")
        assert meta["status"] == "ended", (session.mode, meta)
        assert recorded_units(server, session) >= DONE_BEFORE[session.mode]
        if session.mode != "chat":
            assert (folder / "merged_replay.wav").exists(), session.mode

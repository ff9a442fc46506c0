"""How the gateway tells a busy worker from a dead one, through real
processes: a burst of client events that the worker's session reads only as
fast as its engine allows is not a dead worker (the session goes on), and a
worker that does die, or hangs, ends its sessions at once, a session whose
client had dropped included: it is not held for a resume, and the restarted
worker's slot is free."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import secrets
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from websockets.asyncio.client import connect

from tests.clients import EventSocket, open_client
from tests.servers import Server
from tests.tcp_proxy import TcpProxy


def no_failures(server: Server) -> None:
    log = server.full_log()
    assert "Traceback" not in log and "failed during the session" not in log, server.log()


async def test_a_burst_behind_a_busy_engine_is_not_a_dead_worker(server: Server):
    """OpenAI's GA dialect: 300 ``session.update`` while a slow answer holds
    the engine. The worker's reader waits (its queue of engine work is full),
    so nothing more is read from its socket until the answer ends: a ping on
    that socket went unanswered and the session was ended as if its worker
    had died (``server_error``)."""
    async with connect(f"{server.ws}/v1/realtime?model=m", max_size=None) as ws:
        client = EventSocket(ws)
        await client.until("session.created")
        slow = {"type": "realtime", "instructions": "#latency:0.5"}
        await client.send({"type": "session.update", "session": slow})
        await client.until("session.updated")
        text = "tell me a long story " * 14  # some 25 chunks: 12 s of answer
        content = [{"type": "input_text", "text": text}]
        item = {"type": "message", "role": "user", "content": content}
        await client.send({"type": "conversation.item.create", "item": item})
        await client.send({"type": "response.create"})
        await client.until("response.output_audio.delta")
        for i in range(300):
            session = {"type": "realtime", "temperature": 0.7 + (i % 2) / 10}
            await client.send({"type": "session.update", "session": session})
        done = await client.until("response.done", timeout=60)
        assert done["response"]["status"] == "completed"
        while sum(e["type"] == "session.updated" for e in client.events) < 301:
            await client.until("session.updated", timeout=30)
    assert not [e for e in client.events if e["type"] == "error"]
    no_failures(server)


async def test_an_audio_flood_behind_a_busy_reader_is_not_a_dead_worker(server: Server):
    """``/ws/duplex``: an ``update`` waits for the engine (10 s a step here)
    on the session's reader, and 2,000 audio chunks come behind it; the
    client heard ``worker_failed`` though the worker was fine."""
    client = await open_client(server, path="/ws/duplex", query="?mode=audio")
    await client.prepare("#schedule:L")
    await client.send({"type": "update", "system_prompt": "#schedule:L #latency:10"})
    await client.until("updated")
    tiny = base64.b64encode(np.full(160, 0.01, "<f4").tobytes()).decode()
    chunk = json.dumps({"type": "audio_chunk", "audio_base64": tiny})
    await client.chunk(np.full(16000, 0.01, np.float32))
    await asyncio.sleep(1.0)  # its unit takes the engine (a step the reader cannot see)
    await client.send({"type": "update", "system_prompt": "#schedule:L #latency:10"})
    for _ in range(2000):
        await client.ws.send(chunk)
    await client.until("updated", timeout=40)  # read at last: the session went on
    assert "error" not in client.types(), client.received
    no_failures(server)


@pytest.fixture
async def proxied(tmp_path: Path) -> AsyncIterator[tuple[Server, TcpProxy]]:
    server = Server(tmp_path).start()
    proxy = await TcpProxy(server.port).start()
    try:
        await server.wait_ready(workers=1)
        yield server, proxy
    finally:
        await proxy.close()
        server.stop()


async def suspended_session(server: Server, proxy: TcpProxy) -> tuple[str, int]:
    """A duplex session mid-answer whose client connection was cut: held for
    a resume. Its resume token and the last event number received."""
    sid = f"s_{secrets.token_hex(4)}"
    ws = await connect(f"{proxy.ws}/ws/duplex/{sid}?seq=1&mode=audio", max_size=None)
    client = EventSocket(ws)
    token = (await client.until("queue_done"))["resume_token"]
    prepare = {"type": "prepare", "system_prompt": "#schedule:LS", "config": {}}
    await client.send(prepare)
    await client.until("prepared")
    second = base64.b64encode(np.full(16000, 0.01, "<f4").tobytes()).decode()
    await client.send({"type": "audio_chunk", "audio_base64": second})
    await client.until("result")
    proxy.cut()
    await until_status(server, lambda status: status["suspended_sessions"] == 1)
    return token, client.events[-1]["seq"]


async def until_status(server: Server, holds: Any, timeout: float = 10) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        while True:
            status = await server.get("/status")
            if holds(status):
                return status
            await asyncio.sleep(0.1)


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP])
async def test_a_session_whose_worker_died_is_not_held_for_a_resume(
    proxied: tuple[Server, TcpProxy], how: signal.Signals
):
    """Killed, or hung (then killed when its control channel stops
    answering): the session is over, whatever its client's connection; the
    restarted worker serves with its slot free and a resume is refused."""
    server, proxy = proxied
    token, last_seq = await suspended_session(server, proxy)
    pid = (await server.get("/workers"))["workers"][0]["pid"]
    os.kill(pid, how)
    gone_at = time.monotonic()
    try:
        # the control channel's pings: 2 s apart, 5 s to answer
        status = await until_status(server, lambda s: s["suspended_sessions"] == 0, timeout=12)
        assert time.monotonic() - gone_at < (2 if how is signal.SIGKILL else 12)
        assert status["running_tasks"] == []
        await server.wait_ready(workers=1, timeout=30)
        [worker] = (await server.get("/workers"))["workers"]
        assert worker["pid"] != pid and worker["status"] == "idle" and worker["slots_busy"] == 0
        url = f"{server.ws}/ws/duplex/any?resume_token={token}&last_seq={last_seq}"
        async with connect(url, max_size=None) as ws:
            refused = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert refused["code"] == "resume_refused", refused
    finally:
        if how is signal.SIGSTOP:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

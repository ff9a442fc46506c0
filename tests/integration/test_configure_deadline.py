"""A client that is handed a worker must configure its session within
``limits.first_message_timeout_s`` (prepare, session.update, the chat
request), or the session ends with that protocol's timeout close and the
worker is free again. Time spent queued does not count."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from websockets.asyncio.client import ClientConnection, connect

from tests.servers import Server

DEADLINE_S = 2.0
SECOND_B64 = base64.b64encode(np.zeros(16_000, "<f4").tobytes()).decode()


@pytest.fixture
async def deadline_server(tmp_path: Path) -> AsyncIterator[Server]:
    env = {"OMNILIVE_LIMITS__FIRST_MESSAGE_TIMEOUT_S": str(DEADLINE_S)}
    server = Server(tmp_path, env=env).start()
    try:
        await server.wait_ready(workers=1)
        yield server
    finally:
        server.stop()


async def messages_until_close(
    ws: ClientConnection, keep_sending: dict[str, Any] | None = None, limit_s: float = 20
) -> tuple[list[dict[str, Any]], float]:
    """Everything the server sends until it closes, and when it closed; with
    ``keep_sending``, that message goes out every half second meanwhile."""
    started = time.monotonic()
    received: list[dict[str, Any]] = []

    async def pester() -> None:
        while keep_sending is not None:
            await ws.send(json.dumps(keep_sending))
            await asyncio.sleep(0.5)

    sender = asyncio.create_task(pester())
    try:
        async with asyncio.timeout(limit_s):
            async for raw in ws:
                received.append(json.loads(raw))
    finally:
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
    return received, time.monotonic() - started


async def test_realtime_client_that_never_configures(deadline_server: Server) -> None:
    """The case seen in the field: appends, each answered ``not_ready``, and
    never a ``session.update``."""
    append = {"type": "input_audio_buffer.append", "audio": SECOND_B64}
    async with connect(f"{deadline_server.ws}/v1/realtime?mode=audio") as ws:
        received, elapsed = await messages_until_close(ws, keep_sending=append)
        assert ws.close_code == 1000
    types = [m["type"] for m in received]
    assert types[0] == "session.queue_done"
    assert {m["error"]["code"] for m in received if m["type"] == "error"} == {"not_ready"}
    assert received[-1] == {"type": "session.closed", "reason": "timeout"}
    assert DEADLINE_S - 0.5 < elapsed < DEADLINE_S + 3
    await deadline_server.wait_worker_status("idle")


@pytest.mark.parametrize(
    ("path", "timeout_message"),
    [
        ("/ws/duplex/deadline-d?mode=audio", {"type": "timeout", "reason": "idle"}),
        ("/ws/duplex/deadline-o?mode=omni", {"type": "timeout", "reason": "idle"}),
        ("/ws/half_duplex/deadline-h", {"type": "timeout"}),
    ],
)
async def test_streaming_client_that_never_prepares(
    deadline_server: Server, path: str, timeout_message: dict[str, Any]
) -> None:
    async with connect(f"{deadline_server.ws}{path}") as ws:
        received, elapsed = await messages_until_close(ws)
    assert received[0]["type"] == "queue_done"
    assert received[-1].items() >= timeout_message.items()
    assert DEADLINE_S - 0.5 < elapsed < DEADLINE_S + 3
    await deadline_server.wait_worker_status("idle")


async def test_chat_client_that_never_asks(deadline_server: Server) -> None:
    async with connect(f"{deadline_server.ws}/ws/chat") as ws:
        received, elapsed = await messages_until_close(ws)
    assert received[-1]["type"] == "error"
    assert received[-1]["code"] == "timeout"
    assert DEADLINE_S - 0.5 < elapsed < DEADLINE_S + 3


async def test_time_in_the_queue_does_not_count(deadline_server: Server) -> None:
    """A client queued for longer than the deadline still gets the whole
    deadline once it is handed the worker."""
    first = await connect(f"{deadline_server.ws}/v1/realtime?mode=audio")
    await first.recv()  # session.queue_done: it holds the only worker
    second = await connect(f"{deadline_server.ws}/v1/realtime?mode=audio")
    queued_at = time.monotonic()
    try:
        received, _ = await messages_until_close(first)
        assert received[-1]["reason"] == "timeout"  # the first never configured either
        while json.loads(await second.recv())["type"] != "session.queue_done":
            pass
        assert time.monotonic() - queued_at > DEADLINE_S - 0.5
        await asyncio.sleep(DEADLINE_S / 2)
        update = {"type": "session.update", "session": {"instructions": "Be brief."}}
        await second.send(json.dumps(update))
        assert json.loads(await second.recv())["type"] == "session.created"
    finally:
        await first.close()
        await second.close()

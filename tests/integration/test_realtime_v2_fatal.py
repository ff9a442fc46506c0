"""The newer MiniCPM-o Realtime dialect through a real server: input before
``session.init`` is fatal, and the client hears why twice, as the
reference's clients expect: ``session.closed{backend_error, diagnostic}``,
and a close of 1011 whose reason is ``backend_error``."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.clients import EventSocket
from tests.servers import Server

SECOND = base64.b64encode(np.full(16000, 0.01, "<f4").tobytes()).decode()


@pytest.mark.parametrize("mode", ["audio", "video", "chat"])
async def test_input_before_setup_is_fatal_with_its_code(server: Server, mode: str):
    async with connect(f"{server.ws}/v1/realtime?mode={mode}", max_size=None) as ws:
        client = EventSocket(ws)
        await client.until("session.queue_done")
        given = {"audio": SECOND} if mode != "chat" else {"messages": []}
        await client.send({"type": "input.append", "input": given})
        closed = await client.until("session.closed")
        assert closed["reason"] == "backend_error" and closed["diagnostic"]["message"]
        with pytest.raises(ConnectionClosed):
            await client.recv()
    assert (ws.close_code, ws.close_reason) == (1011, "backend_error")

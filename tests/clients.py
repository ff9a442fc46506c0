"""A small protocol client for the session modes, used by integration tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection, connect

from omnilive.tasks import TaskSet
from tests.servers import Server
from tests.speech import chunks_b64, silence, speak


class Client:
    def __init__(self, ws: ClientConnection, session_id: str) -> None:
        self.ws = ws
        self.session_id = session_id
        self.received: list[dict[str, Any]] = []

    async def recv(self, timeout: float = 20) -> dict[str, Any]:
        message = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
        self.received.append(message)
        return message

    async def until(self, *types: str, timeout: float = 20) -> dict[str, Any]:
        while (message := await self.recv(timeout))["type"] not in types:
            pass
        return message

    async def send(self, message: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(message))

    async def prepare(
        self, system_prompt: str = "You are helpful.", config: dict | None = None, **fields: Any
    ) -> dict:
        await self.until("queue_done")
        message = {"type": "prepare", "system_prompt": system_prompt, "config": config or {}}
        await self.send({**message, **fields})
        return await self.until("prepared")

    async def chunk(self, audio: np.ndarray, **fields: Any) -> None:
        """One duplex ``audio_chunk`` (whatever the length of ``audio``)."""
        await self.send(
            {"type": "audio_chunk", "audio_base64": chunks_b64(audio, 3600)[0], **fields}
        )

    async def speak(self, audio: np.ndarray, pace_s: float = 0.0) -> None:
        for chunk in chunks_b64(audio):
            await self.send({"type": "audio_chunk", "audio_base64": chunk})
            if pace_s:
                await asyncio.sleep(pace_s)

    def types(self) -> list[str]:
        return [m["type"] for m in self.received]


# Every client's socket, closed after each test by the integration conftest:
# a session left open would keep a shared server from coming back idle.
OPENED: list[Client | EventSocket] = []


async def open_client(
    server: Server, session_id: str | None = None, path: str = "/ws/half_duplex", query: str = ""
) -> Client:
    session_id = session_id or f"s_{secrets.token_hex(4)}"
    ws = await connect(f"{server.ws}{path}/{session_id}{query}", max_size=None)
    client = Client(ws, session_id)
    OPENED.append(client)
    return client


async def spoken_turn(
    client: Client, question: str, timeout: float
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One half-duplex turn: prepared for a short answer, ``question`` spoken
    (espeak-ng) between silences at ten times real time. Its ``turn_done``
    and the answer's chunks that carry audio."""
    await client.prepare("Answer in one short sentence.")
    await client.speak(np.concatenate([silence(1.0), speak(question), silence(1.5)]), pace_s=0.1)
    done = await client.until("turn_done", timeout=timeout)
    chunks = [m for m in client.received if m["type"] == "chunk" and m["audio_data"]]
    return done, chunks


async def close_all() -> None:
    while OPENED:
        await OPENED.pop().ws.close()


class EventSocket:
    """A client of an event protocol (the Realtime API's dialects): every
    event received is kept in ``events``."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []
        OPENED.append(self)

    async def recv(self, timeout: float = 10) -> dict[str, Any]:
        event = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
        self.events.append(event)
        return event

    async def until(self, *types: str, timeout: float = 10) -> dict[str, Any]:
        while (event := await self.recv(timeout))["type"] not in types:
            pass
        return event

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(event))


@contextlib.asynccontextmanager
async def owned_task(work: Coroutine[Any, Any, Any], name: str) -> AsyncIterator[asyncio.Task]:
    """``work`` as a task of the house's :class:`TaskSet`, owned by the
    block: one still running when the block ends (a failed assertion
    included) is cancelled and awaited, never left to outlive its test."""
    tasks = TaskSet("test")
    try:
        yield tasks.spawn(name, work)
    finally:
        await tasks.close()

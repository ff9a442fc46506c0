"""The single writer of a session socket.

Runners put messages; one task sends them in order. Control replies never
wait behind media: ``flush()`` drops queued media messages (a stop or an
interruption makes them stale), and the queue is bounded so a slow peer
slows the producer instead of growing memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from omnilive.protocol.internal import Envelope

OUTBOX_SIZE = 64
_CLOSE = object()


class Outbox:
    def __init__(self, send: Callable[[str], Awaitable[None]], size: int = OUTBOX_SIZE) -> None:
        self._send = send
        self._queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=size)
        self.sent = 0

    async def put(self, message: dict[str, Any]) -> None:
        await self._queue.put(message)

    def flush(self) -> int:
        """Drop every message not yet sent; returns how many were dropped."""
        dropped = 0
        while not self._queue.empty():
            self._queue.get_nowait()
            dropped += 1
        return dropped

    def drop(self, stale: Callable[[dict[str, Any]], bool]) -> int:
        """Drop the queued messages ``stale`` picks, keeping the others in
        order (an interrupted answer's audio, not the events around it)."""
        kept = []
        while not self._queue.empty():
            kept.append(self._queue.get_nowait())
        dropped = 0
        for message in kept:
            if message is not _CLOSE and stale(message):
                dropped += 1
            else:
                self._queue.put_nowait(message)
        return dropped

    async def close(self) -> None:
        """Let the writer send what is queued, then stop."""
        await self._queue.put(_CLOSE)

    async def run(self) -> None:
        """The writer task."""
        while (message := await self._queue.get()) is not _CLOSE:
            await self._send(Envelope.frame(message))
            self.sent += 1

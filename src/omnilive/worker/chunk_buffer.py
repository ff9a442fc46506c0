"""The bounded input buffer of the duplex unit loop.

When the model is slower than real time, chunks pile up; keeping them would
make the model answer ever older audio. So the buffer holds a few chunks and
drops the oldest (never the newest) when full, counting what it dropped. A
``force_listen`` on a dropped chunk is carried to the next one: control
overtakes data and is never lost with it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

import numpy as np


@dataclass(eq=False)
class PendingChunk:
    index: int
    received_at: float  # monotonic seconds
    received_wall: float  # epoch seconds
    audio: np.ndarray
    frames: list[bytes] = field(default_factory=list)
    force_listen: bool = False
    max_slice_nums: int | None = None
    input_id: str | None = None
    dropped_before: int = 0  # chunks dropped since the previous processed one


class ChunkBuffer:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._chunks: deque[PendingChunk] = deque()
        self._ready = asyncio.Event()
        self.dropped_total = 0
        self._dropped_since = 0

    def __len__(self) -> int:
        return len(self._chunks)

    def push(self, chunk: PendingChunk) -> PendingChunk | None:
        """Add a chunk; returns the chunk dropped to make room, if any."""
        dropped = None
        if len(self._chunks) >= self.capacity:
            dropped = self._chunks.popleft()
            self.dropped_total += 1
            self._dropped_since += 1
            target = self._chunks[0] if self._chunks else chunk
            target.force_listen = target.force_listen or dropped.force_listen
        self._chunks.append(chunk)
        self._ready.set()
        return dropped

    def clear(self) -> int:
        """Drop everything waiting (e.g. on pause); returns how many."""
        count = len(self._chunks)
        self.dropped_total += count
        self._dropped_since += count
        self._chunks.clear()
        self._ready.clear()
        return count

    async def pop(self) -> PendingChunk:
        """The oldest waiting chunk, with the drops since the last pop."""
        while not self._chunks:
            self._ready.clear()
            await self._ready.wait()
        chunk = self._chunks.popleft()
        chunk.dropped_before, self._dropped_since = self._dropped_since, 0
        if not self._chunks:
            self._ready.clear()
        return chunk

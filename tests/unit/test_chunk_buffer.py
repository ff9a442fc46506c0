"""The duplex unit loop's input buffer, without sockets: drop-oldest, never
the newest, drops counted once, control carried over a dropped chunk."""

from __future__ import annotations

import numpy as np

from omnilive.worker.chunk_buffer import ChunkBuffer, PendingChunk


def chunk(index: int, force_listen: bool = False) -> PendingChunk:
    return PendingChunk(index, 0.0, 0.0, np.zeros(16, np.float32), force_listen=force_listen)


async def drain(buffer: ChunkBuffer) -> list[PendingChunk]:
    return [await buffer.pop() for _ in range(len(buffer))]


async def test_a_full_buffer_drops_the_oldest_and_keeps_the_newest():
    buffer = ChunkBuffer(capacity=3)
    dropped = [buffer.push(chunk(i)) for i in range(5)]
    assert [d.index if d else None for d in dropped] == [None, None, None, 0, 1]
    assert [c.index for c in await drain(buffer)] == [2, 3, 4]
    assert buffer.dropped_total == 2


async def test_drops_are_reported_once_on_the_next_chunk_taken():
    buffer = ChunkBuffer(capacity=2)
    for i in range(4):
        buffer.push(chunk(i))
    first, second = await drain(buffer)
    assert (first.dropped_before, second.dropped_before) == (2, 0)
    buffer.push(chunk(4))
    assert (await buffer.pop()).dropped_before == 0


async def test_a_force_listen_on_a_dropped_chunk_moves_to_the_next():
    buffer = ChunkBuffer(capacity=2)
    buffer.push(chunk(0, force_listen=True))
    buffer.push(chunk(1))
    buffer.push(chunk(2))  # drops 0, whose force_listen goes to 1
    taken = await drain(buffer)
    assert [(c.index, c.force_listen) for c in taken] == [(1, True), (2, False)]


async def test_a_capacity_of_one_carries_control_to_the_chunk_that_replaces_it():
    buffer = ChunkBuffer(capacity=1)
    buffer.push(chunk(0, force_listen=True))
    buffer.push(chunk(1))
    [kept] = await drain(buffer)
    assert (kept.index, kept.force_listen, kept.dropped_before) == (1, True, 1)


async def test_clear_counts_everything_waiting_as_dropped():
    buffer = ChunkBuffer(capacity=4)
    for i in range(3):
        buffer.push(chunk(i))
    assert buffer.clear() == 3 and len(buffer) == 0
    buffer.push(chunk(3))
    assert (await buffer.pop()).dropped_before == 3
    assert buffer.dropped_total == 3

"""The bounded event buffer: drop-oldest when nobody reads, the outcome at the end."""

from __future__ import annotations

import pytest

from omnilive.client.buffer import EventBuffer
from omnilive.client.errors import WorkerFailedError
from omnilive.client.events import TurnDone


async def test_a_full_buffer_drops_its_oldest_and_counts_them():
    buffer = EventBuffer(capacity=3)
    for index in range(5):
        buffer.put(TurnDone(turn_index=index))
    assert buffer.dropped == 2 and len(buffer) == 3
    buffer.end(None)
    got = [event.turn_index async for event in _drain(buffer)]
    assert got == [2, 3, 4]


async def test_the_outcome_is_raised_after_the_events():
    buffer = EventBuffer(capacity=8)
    buffer.put(TurnDone(turn_index=0))
    buffer.end(WorkerFailedError("gone"))
    assert (await buffer.get()).turn_index == 0
    with pytest.raises(WorkerFailedError):
        await buffer.get()


async def _drain(buffer: EventBuffer):
    while True:
        try:
            yield await buffer.get()
        except StopAsyncIteration:
            return

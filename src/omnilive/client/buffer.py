"""The events a session holds for its user, bounded.

The socket reader never waits for the user: a session must hear ``stopped``
or an error even when nobody reads its events. So the buffer has a fixed
capacity and, when full, drops its oldest event and counts it (``dropped``).
A reader that keeps up never loses anything.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from omnilive.client.errors import OmniliveError
from omnilive.client.events import Event

log = logging.getLogger(__name__)
DEFAULT_CAPACITY = 4096  # at one event per streamed piece, many minutes of answers


class EventBuffer:
    """First in, first out, for one consumer; ends with the session's outcome."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._events: deque[Event] = deque()
        self._capacity = capacity
        self._changed = asyncio.Event()
        self._ended = False
        self._outcome: OmniliveError | None = None
        self.dropped = 0

    def put(self, event: Event) -> None:
        if len(self._events) >= self._capacity:
            self._events.popleft()
            self.dropped += 1
            if self.dropped == 1:
                log.warning("events are not being read: dropping the oldest (capacity %d)",
                            self._capacity)  # fmt: skip
        self._events.append(event)
        self._changed.set()

    def end(self, outcome: OmniliveError | None) -> None:
        """No more events; once drained, ``get`` raises ``outcome`` (or StopAsyncIteration)."""
        self._ended = True
        self._outcome = outcome
        self._changed.set()

    async def get(self) -> Event:
        while not self._events:
            if self._ended:
                if self._outcome is not None:
                    raise self._outcome
                raise StopAsyncIteration
            self._changed.clear()
            await self._changed.wait()
        return self._events.popleft()

    def __len__(self) -> int:
        return len(self._events)

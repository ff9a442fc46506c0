"""The server at a glance: per worker its slots in use, unit latency and dropped
chunks, and the queue, over the last minutes; and each session's context now
(``GET /api/admin/live``).

Made only from what the gateway already measures: the session observers
report each duplex unit's ``wall_clock_ms`` and ``dropped_chunks`` with the
worker that served it (:meth:`LiveStats.unit`), and a sampler reads the pool's
slots and queue every ``period_s`` (:func:`sample_periodically`), closing the
window of units into one :class:`Sample`. The ring keeps ``keep`` samples (the
last five minutes by default); a window keeps at most ``MAX_UNITS_PER_WINDOW``
latencies, dropping the oldest, so nothing grows with the traffic.

Each duplex session's context as its last unit left it (:meth:`LiveStats.context`)
is kept until its connection ends (:meth:`LiveStats.forget`); at most
``MAX_CONTEXTS`` sessions, the one longest without news leaving first, so that a
forget that never came (a bug) cannot grow the map either.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

PERIOD_S = 2.0
KEEP = 150  # five minutes of 2 s samples
MAX_UNITS_PER_WINDOW = 4096
MAX_CONTEXTS = 4096


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank ``q`` percentile (0-100) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class _Window:
    """What one worker's units showed since the last sample."""

    latencies_ms: deque[float] = field(default_factory=lambda: deque(maxlen=MAX_UNITS_PER_WINDOW))
    units: int = 0
    dropped: int = 0


@dataclass(frozen=True)
class WorkerSample:
    slots_busy: int
    slots: int
    units: int
    p50_ms: float | None
    p95_ms: float | None
    dropped: int


@dataclass(frozen=True)
class Sample:
    t: float  # epoch seconds
    queue_length: int
    queue_wait_s: float  # the oldest waiting ticket's wait so far
    workers: dict[str, WorkerSample]


@dataclass(frozen=True)
class SessionContext:
    """A session's context after its last unit."""

    worker_id: str
    kv_cache_length: int
    context_capacity: int | None  # None: the engine did not say
    evicted_units: int
    updated_at: float  # epoch seconds

    def to_json(self, session_id: str) -> dict[str, Any]:
        capacity = self.context_capacity
        fill = round(self.kv_cache_length / capacity, 3) if capacity else None
        return {
            "session_id": session_id,
            "worker_id": self.worker_id,
            "kv_cache_length": self.kv_cache_length,
            "context_capacity": capacity,
            "evicted_units": self.evicted_units,
            "fill": fill,
        }


@dataclass(frozen=True)
class WorkerSlots:
    """A worker's slots at the moment of a sample."""

    worker_id: str
    slots_busy: int
    slots: int


class LiveStats:
    """A ring of samples, and the window of units the next sample will close."""

    def __init__(
        self, period_s: float = PERIOD_S, keep: int = KEEP, max_contexts: int = MAX_CONTEXTS
    ) -> None:
        self.period_s = period_s
        self.samples: deque[Sample] = deque(maxlen=keep)
        self._windows: dict[str, _Window] = {}
        self.max_contexts = max_contexts
        # By the time of their last news, oldest first (a dict keeps insertion order).
        self._contexts: dict[str, SessionContext] = {}

    def unit(self, worker_id: str, wall_clock_ms: float | None, dropped: int) -> None:
        """One duplex unit's result, relayed from ``worker_id``."""
        window = self._windows.setdefault(worker_id, _Window())
        if wall_clock_ms is not None:
            window.latencies_ms.append(wall_clock_ms)
            window.units += 1
        window.dropped += dropped

    def context(self, session_id: str, context: SessionContext) -> None:
        """A session's context after one of its units."""
        self._contexts.pop(session_id, None)  # to the end: the newest news
        self._contexts[session_id] = context
        while len(self._contexts) > self.max_contexts:
            del self._contexts[next(iter(self._contexts))]

    def forget(self, session_id: str) -> None:
        """The session's connection ended: its context is no longer shown."""
        self._contexts.pop(session_id, None)

    def contexts(self) -> list[dict[str, Any]]:
        """Every session's context, by worker then session."""
        ordered = sorted(self._contexts.items(), key=lambda item: (item[1].worker_id, item[0]))
        return [context.to_json(session_id) for session_id, context in ordered]

    def sample(
        self, t: float, queue_length: int, queue_wait_s: float, workers: Iterable[WorkerSlots]
    ) -> Sample:
        """Close the current window into a sample taken at ``t``."""
        windows, self._windows = self._windows, {}
        taken = {}
        for worker in workers:
            window = windows.get(worker.worker_id, _Window())
            latencies = list(window.latencies_ms)
            taken[worker.worker_id] = WorkerSample(
                slots_busy=worker.slots_busy,
                slots=worker.slots,
                units=window.units,
                p50_ms=percentile(latencies, 50),
                p95_ms=percentile(latencies, 95),
                dropped=window.dropped,
            )
        sample = Sample(t, queue_length, queue_wait_s, taken)
        self.samples.append(sample)
        return sample

    def to_json(self) -> dict[str, Any]:
        return {
            "period_s": self.period_s,
            "samples": [asdict(s) for s in self.samples],
            "contexts": self.contexts(),
        }


async def sample_periodically(
    stats: LiveStats,
    read: Callable[[], tuple[int, float, list[WorkerSlots]]],
    clock: Callable[[], float] = time.time,
) -> None:
    """Every ``stats.period_s``: the queue and the slots from ``read``, into a sample."""
    while True:
        await asyncio.sleep(stats.period_s)
        queue_length, queue_wait_s, workers = read()
        stats.sample(clock(), queue_length, queue_wait_s, workers)

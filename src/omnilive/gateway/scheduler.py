"""The worker pool's scheduling core: pure, synchronous, no I/O.

One FIFO of tickets and one dispatch point. Every operation that can free a
slot or change the queue calls :meth:`Scheduler._dispatch`, which hands the
head of the queue to a free slot until either runs out, marking the lease at
once so a slot is never handed out twice. Methods return the tickets that
were just assigned, for the async layer (``pool.py``) to wake up.
"""

from __future__ import annotations

import heapq
import itertools
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from omnilive.config import RequestType
from omnilive.gateway.eta import EtaModel


class WorkerHealth(StrEnum):
    LOADING = "loading"
    READY = "ready"
    ERROR = "error"
    OFFLINE = "offline"


def new_ticket_id() -> str:
    return f"q_{secrets.token_hex(6)}"


class QueueFullError(Exception):
    """The queue holds ``max_queue_size`` tickets already."""


class NoWorkersError(Exception):
    """No worker is configured at all, so nothing could ever serve a ticket."""


@dataclass
class Lease:
    """One slot of one worker, held by one session."""

    lease_id: str
    worker_id: str
    worker_url: str
    ticket_id: str
    request_type: RequestType
    session_id: str
    started_at: float


@dataclass
class Ticket:
    ticket_id: str
    request_type: RequestType
    session_id: str
    enqueued_at: float
    lease: Lease | None = None


@dataclass
class WorkerRecord:
    worker_id: str
    url: str
    slots: int = 1
    health: WorkerHealth = WorkerHealth.OFFLINE
    capabilities: dict[str, Any] = field(default_factory=dict)
    leases: dict[str, Lease] = field(default_factory=dict)
    total_requests: int = 0
    total_busy_s: float = 0.0
    last_seen: float | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def free_slots(self) -> int:
        if self.health is not WorkerHealth.READY:
            return 0
        return max(0, self.slots - len(self.leases))


class Scheduler:
    """FIFO queue, slot leases and wait estimates for a set of workers."""

    def __init__(self, eta: EtaModel, max_queue_size: int, clock: Callable[[], float]) -> None:
        self.eta = eta
        self.max_queue_size = max_queue_size
        self.clock = clock
        self.workers: dict[str, WorkerRecord] = {}
        self.queue: OrderedDict[str, Ticket] = OrderedDict()
        self._lease_counter = itertools.count(1)

    # --- workers -------------------------------------------------------------

    def add_worker(self, worker_id: str, url: str, slots: int = 1) -> None:
        self.workers.setdefault(worker_id, WorkerRecord(worker_id, url, slots))

    def set_worker_state(
        self,
        worker_id: str,
        health: WorkerHealth,
        slots: int | None = None,
        capabilities: dict[str, Any] | None = None,
    ) -> list[Ticket]:
        worker = self.workers[worker_id]
        if health is WorkerHealth.OFFLINE and worker.health is not WorkerHealth.OFFLINE:
            # Sessions on a dead process are gone; a restarted worker starts empty.
            worker.leases.clear()
        worker.health = health
        if slots is not None:
            worker.slots = slots
        if capabilities is not None:
            worker.capabilities = capabilities
        worker.last_seen = self.clock()
        return self._dispatch()

    # --- tickets -------------------------------------------------------------

    def submit(
        self, request_type: RequestType, session_id: str, ticket_id: str | None = None
    ) -> Ticket:
        """Queue a request; it may be assigned at once (``ticket.lease`` set).
        ``ticket_id`` is for a gateway that named the ticket before sending it here."""
        if not self.workers:
            raise NoWorkersError("no workers are configured")
        must_wait = bool(self.queue) or self._best_worker() is None
        if must_wait and len(self.queue) >= self.max_queue_size:
            raise QueueFullError(f"queue is full ({self.max_queue_size} waiting)")
        ticket = Ticket(ticket_id or new_ticket_id(), request_type, session_id, self.clock())
        self.queue[ticket.ticket_id] = ticket
        self._dispatch()
        return ticket

    def cancel(self, ticket_id: str) -> tuple[bool, list[Ticket]]:
        """Remove a waiting ticket. Returns whether it was waiting, and assignments."""
        ticket = self.queue.pop(ticket_id, None)
        return ticket is not None, self._dispatch()

    def release(self, lease: Lease, ok: bool = True) -> list[Ticket]:
        """Give a slot back; successful sessions feed the ETA model."""
        worker = self.workers.get(lease.worker_id)
        if worker is not None and worker.leases.pop(lease.lease_id, None) is not None:
            duration = max(0.0, self.clock() - lease.started_at)
            worker.total_requests += 1
            worker.total_busy_s += duration
            if ok:
                self.eta.observe(lease.request_type, duration)
        return self._dispatch()

    def position(self, ticket_id: str) -> int | None:
        """1-based place in the queue, or None when not waiting."""
        for index, key in enumerate(self.queue, start=1):
            if key == ticket_id:
                return index
        return None

    def _dispatch(self) -> list[Ticket]:
        assigned: list[Ticket] = []
        while self.queue:
            worker = self._best_worker()
            if worker is None:
                break
            _, ticket = self.queue.popitem(last=False)
            lease = Lease(
                lease_id=f"l{next(self._lease_counter)}",
                worker_id=worker.worker_id,
                worker_url=worker.url,
                ticket_id=ticket.ticket_id,
                request_type=ticket.request_type,
                session_id=ticket.session_id,
                started_at=self.clock(),
            )
            worker.leases[lease.lease_id] = lease
            ticket.lease = lease
            assigned.append(ticket)
        return assigned

    def _best_worker(self) -> WorkerRecord | None:
        """The ready worker with the most free slots (spreads load across GPUs)."""
        candidates = [w for w in self.workers.values() if w.free_slots > 0]
        if not candidates:
            return None
        return max(candidates, key=lambda w: (w.free_slots, -len(w.leases)))

    # --- estimates -------------------------------------------------------------

    def estimates(self) -> dict[str, float]:
        """Estimated wait of every queued ticket, in queue order.

        Each slot of a usable worker becomes free at some time (now if idle,
        else the remaining time of its lease); walking the queue, each ticket
        takes the earliest-free slot, which then stays busy for that ticket's
        baseline.
        """
        now = self.clock()
        free_at: list[float] = []
        for worker in self.workers.values():
            if worker.health not in (WorkerHealth.READY, WorkerHealth.LOADING):
                continue
            busy = [
                self.eta.remaining(lease.request_type, now - lease.started_at)
                for lease in worker.leases.values()
            ]
            free_at.extend(busy + [0.0] * max(0, worker.slots - len(busy)))
        if not free_at:
            free_at = [0.0]  # nothing up now: assume one slot, so waits still grow in order
        heapq.heapify(free_at)
        waits: dict[str, float] = {}
        for ticket_id, ticket in self.queue.items():
            start = heapq.heappop(free_at)
            waits[ticket_id] = start
            heapq.heappush(free_at, start + self.eta.baseline(ticket.request_type))
        return waits

    def snapshot(self) -> list[dict[str, Any]]:
        """The queue as ``GET /api/queue`` shows it."""
        now = self.clock()
        waits = self.estimates()
        return [
            {
                "ticket_id": t.ticket_id,
                "request_type": t.request_type,
                "session_id": t.session_id,
                "position": position,
                "estimated_wait_s": round(waits[t.ticket_id], 1),
                "enqueued_at": t.enqueued_at,
                "wait_elapsed_s": round(now - t.enqueued_at, 1),
            }
            for position, t in enumerate(self.queue.values(), start=1)
        ]

    def running(self) -> list[dict[str, Any]]:
        now = self.clock()
        return [
            {
                "worker_id": lease.worker_id,
                "request_type": lease.request_type,
                "session_id": lease.session_id,
                "started_at": lease.started_at,
                "elapsed_s": round(now - lease.started_at, 1),
                "estimated_remaining_s": round(
                    self.eta.remaining(lease.request_type, now - lease.started_at), 1
                ),
            }
            for worker in self.workers.values()
            for lease in worker.leases.values()
        ]

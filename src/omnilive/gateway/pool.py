"""The async face of the scheduler: futures for waiting tickets and a
broadcast of queue changes, so waiting clients hear about their new position
at once instead of polling.

:class:`Pool` holds the scheduler in this process. A gateway on a Ray cluster
uses ``omnilive.cluster.remote_pool.ClusterPool`` instead, whose scheduler
lives in one actor that every gateway shares; both tell a waiting client the
same way (:meth:`PoolFace.acquire`)."""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from omnilive.config import RequestType, Settings
from omnilive.gateway.eta import EtaModel
from omnilive.gateway.scheduler import Lease, Scheduler, Ticket, WorkerHealth
from omnilive.protocol.common import QUEUE_DONE, queue_update_message, queued_message

SendJson = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True)
class QueueStatus:
    """Where a waiting ticket stands."""

    position: int
    wait_s: float
    length: int

    def shown(self) -> tuple[int, int, int]:
        """What a client is told (the wait in whole seconds): a change worth an update."""
        return self.position, round(self.wait_s), self.length


class PoolFace(ABC):
    """What the gateway's routes use of the pool, wherever its scheduler lives.
    ``scheduler`` is the authority (:class:`Pool`) or a read-only mirror of it
    (on a cluster), for the status pages."""

    scheduler: Scheduler
    update_interval_s: float

    @abstractmethod
    def add_worker(self, worker_id: str, url: str) -> None: ...

    @abstractmethod
    def set_worker_state(
        self,
        worker_id: str,
        health: WorkerHealth,
        slots: int | None = None,
        capabilities: dict[str, Any] | None = None,
    ) -> None: ...

    @abstractmethod
    def submit(self, request_type: RequestType, session_id: str) -> Ticket:
        """Raises ``QueueFullError`` / ``NoWorkersError``."""

    @abstractmethod
    def cancel(self, ticket: Ticket) -> None:
        """Withdraw a ticket, or give back its lease if it was just assigned."""

    @abstractmethod
    def cancel_by_id(self, ticket_id: str) -> bool:
        """Admin cancel: the waiting client is woken with ``LookupError``."""

    @abstractmethod
    def retype(self, ticket: Ticket | None, lease: Lease | None, kind: RequestType) -> None:
        """A session declared its type late (e.g. ``mode`` in prepare): its
        estimate, its ETA sample and the status pages follow the new type."""

    @abstractmethod
    def release(self, lease: Lease, ok: bool = True) -> None: ...

    @abstractmethod
    async def _first(self, ticket: Ticket) -> Lease | QueueStatus:
        """The ticket's lease, or its place in the queue, right after submit.
        Raises ``QueueFullError`` / ``NoWorkersError`` for a refusal found late."""

    @abstractmethod
    async def _next(
        self, ticket: Ticket, known: QueueStatus, timeout: float
    ) -> Lease | QueueStatus:
        """The lease once assigned, else the ticket's place once it differs from
        ``known`` or the queue changes, or after ``timeout``. Raises
        ``LookupError`` when the ticket was cancelled."""

    async def acquire(self, ticket: Ticket, send: SendJson, always_done: bool = False) -> Lease:
        """Wait for a lease, telling the client its place as it changes and at
        least every ``update_interval_s``. Cancelling this withdraws the ticket."""
        try:
            progress = await self._first(ticket)
            if isinstance(progress, Lease):
                if always_done:
                    await send(QUEUE_DONE)
                return progress
            known = progress
            await send(queued_message(known.position, known.wait_s, ticket.ticket_id, known.length))
            loop = asyncio.get_running_loop()
            last_sent = loop.time()
            while True:
                progress = await self._next(ticket, known, self.update_interval_s)
                if isinstance(progress, Lease):
                    await send(QUEUE_DONE)
                    return progress
                due = loop.time() - last_sent >= self.update_interval_s
                if progress.shown() != known.shown() or due:
                    await send(
                        queue_update_message(progress.position, progress.wait_s, progress.length)
                    )
                    known, last_sent = progress, loop.time()
        except BaseException:
            self.cancel(ticket)
            raise


class Pool(PoolFace):
    """The only authority on leases. All methods run on the event loop."""

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.time) -> None:
        self.scheduler = Scheduler(EtaModel(settings.eta), settings.max_queue_size, clock)
        self.update_interval_s = settings.queue_update_interval_s
        self._futures: dict[str, asyncio.Future[Lease]] = {}
        self._changed = asyncio.Event()

    # --- workers -------------------------------------------------------------

    def add_worker(self, worker_id: str, url: str) -> None:
        self.scheduler.add_worker(worker_id, url)
        # A worker that came back (restarted on a cluster) may listen elsewhere.
        self.scheduler.workers[worker_id].url = url

    def set_worker_state(
        self,
        worker_id: str,
        health: WorkerHealth,
        slots: int | None = None,
        capabilities: dict[str, Any] | None = None,
    ) -> None:
        self._wake(self.scheduler.set_worker_state(worker_id, health, slots, capabilities))

    # --- tickets -------------------------------------------------------------

    def submit(
        self, request_type: RequestType, session_id: str, ticket_id: str | None = None
    ) -> Ticket:
        """Raises ``QueueFullError`` / ``NoWorkersError``."""
        ticket = self.scheduler.submit(request_type, session_id, ticket_id)
        if ticket.lease is None:
            self._futures[ticket.ticket_id] = asyncio.get_running_loop().create_future()
        self.notify()
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        self._futures.pop(ticket.ticket_id, None)
        if ticket.lease is not None:
            self.release(ticket.lease, ok=False)
            return
        _, assigned = self.scheduler.cancel(ticket.ticket_id)
        self._wake(assigned)

    def cancel_by_id(self, ticket_id: str) -> bool:
        waiting, assigned = self.scheduler.cancel(ticket_id)
        future = self._futures.pop(ticket_id, None)
        if future is not None and not future.done():
            future.set_exception(LookupError("ticket cancelled"))
        self._wake(assigned)
        return waiting

    def retype(self, ticket: Ticket | None, lease: Lease | None, kind: RequestType) -> None:
        if ticket is not None:
            ticket.request_type = kind
        if lease is not None:
            lease.request_type = kind
        self.notify()

    def release(self, lease: Lease, ok: bool = True) -> None:
        self._wake(self.scheduler.release(lease, ok))

    async def wait(self, ticket: Ticket, timeout: float) -> Lease | None:
        """Wait until the ticket is assigned (its lease), the queue changes, or
        ``timeout`` passes (None)."""
        if ticket.lease is not None:
            return ticket.lease
        future = self._futures.get(ticket.ticket_id)
        if future is None:
            raise LookupError("ticket cancelled")
        changed = asyncio.create_task(self._changed.wait(), name=f"{ticket.ticket_id}:queue-change")
        try:
            waiting: list[asyncio.Future[Any]] = [future, changed]
            await asyncio.wait(waiting, timeout=timeout, return_when="FIRST_COMPLETED")
        finally:
            changed.cancel()
        if future.done():
            self._futures.pop(ticket.ticket_id, None)
            return future.result()
        return None

    def status_of(self, ticket: Ticket) -> QueueStatus:
        """Where a waiting ticket stands (position 0 once it left the queue)."""
        position = self.scheduler.position(ticket.ticket_id) or 0
        wait = self.scheduler.estimates().get(ticket.ticket_id, 0.0)
        return QueueStatus(position, wait, len(self.scheduler.queue))

    def next_change(self) -> asyncio.Event:
        """Set at the next change of the queue, the leases or a worker's state."""
        return self._changed

    async def _first(self, ticket: Ticket) -> Lease | QueueStatus:
        return ticket.lease if ticket.lease is not None else self.status_of(ticket)

    async def _next(
        self, ticket: Ticket, known: QueueStatus, timeout: float
    ) -> Lease | QueueStatus:
        lease = await self.wait(ticket, timeout)
        return lease if lease is not None else self.status_of(ticket)

    # --- internals -------------------------------------------------------------

    def _wake(self, assigned: list[Ticket]) -> None:
        for ticket in assigned:
            future = self._futures.pop(ticket.ticket_id, None)
            if future is not None and not future.done() and ticket.lease is not None:
                future.set_result(ticket.lease)
            elif ticket.lease is not None and future is not None:
                # The waiter is gone (cancelled at the same moment): free the slot.
                self.release(ticket.lease, ok=False)
        self.notify()

    def notify(self) -> None:
        """Wake whoever follows the queue (waiting tickets, status mirrors)."""
        self._changed.set()
        self._changed = asyncio.Event()

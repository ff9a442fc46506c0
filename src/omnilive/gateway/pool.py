"""The async face of the scheduler: futures for waiting tickets and a
broadcast of queue changes, so waiting clients hear about their new position
at once instead of polling."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from omnilive.config import RequestType, Settings
from omnilive.gateway.eta import EtaModel
from omnilive.gateway.scheduler import Lease, Scheduler, Ticket, WorkerHealth
from omnilive.protocol.common import QUEUE_DONE, queue_update_message, queued_message

SendJson = Callable[[dict[str, Any]], Awaitable[None]]


class Pool:
    """The only authority on leases. All methods run on the event loop."""

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.time) -> None:
        self.scheduler = Scheduler(EtaModel(settings.eta), settings.max_queue_size, clock)
        self.update_interval_s = settings.queue_update_interval_s
        self._futures: dict[str, asyncio.Future[Lease]] = {}
        self._changed = asyncio.Event()

    # --- workers -------------------------------------------------------------

    def add_worker(self, worker_id: str, url: str) -> None:
        self.scheduler.add_worker(worker_id, url)

    def set_worker_state(
        self,
        worker_id: str,
        health: WorkerHealth,
        slots: int | None = None,
        capabilities: dict[str, Any] | None = None,
    ) -> None:
        self._wake(self.scheduler.set_worker_state(worker_id, health, slots, capabilities))

    # --- tickets -------------------------------------------------------------

    def submit(self, request_type: RequestType, session_id: str) -> Ticket:
        """Raises ``QueueFullError`` / ``NoWorkersError``."""
        ticket = self.scheduler.submit(request_type, session_id)
        if ticket.lease is None:
            self._futures[ticket.ticket_id] = asyncio.get_running_loop().create_future()
        self._notify()
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        """Withdraw a ticket, or give back its lease if it was just assigned."""
        self._futures.pop(ticket.ticket_id, None)
        if ticket.lease is not None:
            self.release(ticket.lease, ok=False)
            return
        _, assigned = self.scheduler.cancel(ticket.ticket_id)
        self._wake(assigned)

    def cancel_by_id(self, ticket_id: str) -> bool:
        """Admin cancel: the waiting client is woken with ``LookupError``."""
        waiting, assigned = self.scheduler.cancel(ticket_id)
        future = self._futures.pop(ticket_id, None)
        if future is not None and not future.done():
            future.set_exception(LookupError("ticket cancelled"))
        self._wake(assigned)
        return waiting

    def retype(self, ticket: Ticket | None, lease: Lease | None, kind: RequestType) -> None:
        """A session declared its type late (e.g. ``mode`` in prepare): its
        estimate, its ETA sample and the status pages follow the new type."""
        if ticket is not None:
            ticket.request_type = kind
        if lease is not None:
            lease.request_type = kind
        self._notify()

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
            await asyncio.wait([future, changed], timeout=timeout, return_when="FIRST_COMPLETED")
        finally:
            changed.cancel()
        if future.done():
            self._futures.pop(ticket.ticket_id, None)
            return future.result()
        return None

    def status_of(self, ticket: Ticket) -> tuple[int, float, int]:
        """(position, estimated wait, queue length) of a waiting ticket."""
        position = self.scheduler.position(ticket.ticket_id) or 0
        wait = self.scheduler.estimates().get(ticket.ticket_id, 0.0)
        return position, wait, len(self.scheduler.queue)

    async def acquire(self, ticket: Ticket, send: SendJson, always_done: bool = False) -> Lease:
        """Wait for a lease, telling the client its place as it changes and at
        least every ``update_interval_s``. Cancelling this withdraws the ticket."""
        try:
            if ticket.lease is not None:
                if always_done:
                    await send(QUEUE_DONE)
                return ticket.lease
            position, wait, length = self.status_of(ticket)
            await send(queued_message(position, wait, ticket.ticket_id, length))
            last = (position, round(wait), length)
            loop = asyncio.get_running_loop()
            last_sent = loop.time()
            while True:
                lease = await self.wait(ticket, self.update_interval_s)
                if lease is not None:
                    await send(QUEUE_DONE)
                    return lease
                position, wait, length = self.status_of(ticket)
                current = (position, round(wait), length)
                if current != last or loop.time() - last_sent >= self.update_interval_s:
                    await send(queue_update_message(position, wait, length))
                    last, last_sent = current, loop.time()
        except BaseException:
            self.cancel(ticket)
            raise

    # --- internals -------------------------------------------------------------

    def _wake(self, assigned: list[Ticket]) -> None:
        for ticket in assigned:
            future = self._futures.pop(ticket.ticket_id, None)
            if future is not None and not future.done() and ticket.lease is not None:
                future.set_result(ticket.lease)
            elif ticket.lease is not None and future is not None:
                # The waiter is gone (cancelled at the same moment): free the slot.
                self.release(ticket.lease, ok=False)
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

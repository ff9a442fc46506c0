"""The gateway's pool on a cluster: the same face as
:class:`~omnilive.gateway.pool.Pool`, with the scheduler in the registry actor.

Routes call the pool synchronously (submit, release, cancel...). Here such a
call changes only what this gateway knows, queues an operation for the
registry, and returns; the operations of one event-loop turn travel as one
numbered batch, which the registry applies after this gateway's earlier
ones. A submit's answer (a lease at once, or a place in the queue, or a
refusal) is awaited by the route's ``acquire``, which then long-polls the
registry for the ticket's progress: positions and estimates come from the one
scheduler, whichever gateway asks.

``scheduler`` is a mirror of the registry's, refreshed whenever it changes,
for what the routes only read (``/status``, ``/api/queue``, ``/workers``,
metrics). It lags by a round trip; the queue itself never depends on it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import secrets
import socket
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from omnilive.cluster.protocol import (
    AdminCancel,
    Cancelled,
    ClusterState,
    Op,
    Refused,
    Release,
    Retype,
    SetHealth,
    Submit,
    SubmitAnswer,
    UpdateEta,
    Withdraw,
)
from omnilive.cluster.ray_api import first_line, import_ray
from omnilive.config import RequestType, Settings
from omnilive.gateway.bridge import WorkerConnectError
from omnilive.gateway.eta import EtaModel
from omnilive.gateway.links import WorkerLink
from omnilive.gateway.pool import PoolFace, QueueStatus
from omnilive.gateway.scheduler import (
    Lease,
    NoWorkersError,
    QueueFullError,
    Scheduler,
    Ticket,
    WorkerHealth,
    new_ticket_id,
)

log = logging.getLogger(__name__)

# A mirror poll returns at once on a change, else after this long (it is the
# gateway's heartbeat too: well under ``ray.gateway_timeout_s``).
STATE_POLL_S = 2.0
# Between two mirror refreshes: a burst of changes costs one state, not one each.
MIRROR_MIN_INTERVAL_S = 0.05


def gateway_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


class QueueLost(WorkerConnectError):
    """The registry actor cannot be reached: nothing can be queued or leased."""


class ForwardingEta(EtaModel):
    """The mirror's ETA model: ``PUT /api/config/eta`` changes the registry's."""

    def __init__(self, settings: Settings, forward: Callable[[dict[str, Any]], object]) -> None:
        super().__init__(settings.eta)
        self._forward = forward

    def update(self, changes: dict[str, Any]) -> None:
        super().update(changes)
        self._forward(changes)

    def adopt(self, other: EtaModel) -> None:
        self.settings = other.settings
        self._ema = other._ema


def _consume(future: asyncio.Future[Any]) -> None:
    """An answer nobody waits for any more: read it, so that its error is not
    reported as never retrieved."""
    if not future.cancelled():
        future.exception()


class ClusterPool(PoolFace):
    """This gateway's face of the shared queue. All methods run on its loop."""

    def __init__(
        self,
        settings: Settings,
        registry: Any,
        gateway_id: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.gateway_id = gateway_id
        self.update_interval_s = settings.queue_update_interval_s
        eta = ForwardingEta(settings, lambda changes: self._send(UpdateEta(changes)))
        self.scheduler = Scheduler(eta, settings.max_queue_size, clock)
        self.version = -1
        self.lost: str | None = None
        self._batches = itertools.count()
        self._pending: list[tuple[Op, asyncio.Future[Any] | None]] = []
        self._answers: dict[str, asyncio.Future[Any]] = {}

    # --- operations, batched -----------------------------------------------------

    def _send(self, op: Op, answer: bool = False) -> asyncio.Future[Any] | None:
        loop = asyncio.get_running_loop()
        future = loop.create_future() if answer else None
        if not self._pending:
            loop.call_soon(self._flush)
        self._pending.append((op, future))
        return future

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        ref = self.registry.apply.remote(
            self.gateway_id, next(self._batches), [op for op, _ in batch]
        )
        futures = [future for _, future in batch]
        asyncio.wrap_future(ref.future()).add_done_callback(
            lambda done: self._answered(done, futures)
        )

    def _answered(
        self, done: asyncio.Future[Any], futures: list[asyncio.Future[Any] | None]
    ) -> None:
        if done.cancelled():  # the gateway is shutting down
            return
        error = done.exception()
        if error is not None:
            self._lose(error)
        for index, future in enumerate(futures):
            if future is None or future.done():
                continue
            if error is not None:
                future.set_exception(QueueLost(f"the cluster's queue is unreachable: {error}"))
            else:
                future.set_result(done.result()[index])

    def _lose(self, error: BaseException) -> None:
        if self.lost is None:
            self.lost = f"lost the cluster's queue (the registry actor): {first_line(error)}"
            log.error("%s", self.lost)

    # --- the pool's face ---------------------------------------------------------

    def add_worker(self, worker_id: str, url: str) -> None:
        """Workers come from the registry's state (see :meth:`follow`)."""

    def set_worker_state(
        self,
        worker_id: str,
        health: WorkerHealth,
        slots: int | None = None,
        capabilities: dict[str, Any] | None = None,
    ) -> None:
        record = self.scheduler.workers.get(worker_id)
        if record is not None:
            record.health = health
        self._send(SetHealth(worker_id, health))

    def submit(self, request_type: RequestType, session_id: str) -> Ticket:
        if self.lost is not None:
            raise NoWorkersError(self.lost)
        if not self.scheduler.workers:
            raise NoWorkersError("no workers are configured")
        queue = self.scheduler.queue
        if queue and len(queue) >= self.scheduler.max_queue_size:
            raise QueueFullError(f"queue is full ({self.scheduler.max_queue_size} waiting)")
        ticket = Ticket(new_ticket_id(), request_type, session_id, self.scheduler.clock())
        answer = self._send(Submit(ticket.ticket_id, request_type, session_id), answer=True)
        assert answer is not None
        self._answers[ticket.ticket_id] = answer
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        answer = self._answers.pop(ticket.ticket_id, None)
        if answer is not None:
            answer.add_done_callback(_consume)
        if ticket.lease is not None:
            self._send(Release(ticket.lease, ok=False))
        else:
            self._send(Withdraw(ticket.ticket_id))

    def cancel_by_id(self, ticket_id: str) -> bool:
        # Answered from the mirror; the registry wakes the client wherever it waits.
        waiting = ticket_id in self.scheduler.queue
        self._send(AdminCancel(ticket_id))
        return waiting

    def retype(self, ticket: Ticket | None, lease: Lease | None, kind: RequestType) -> None:
        if ticket is not None:
            ticket.request_type = kind
        if lease is not None:
            lease.request_type = kind
        held = ticket or lease
        if held is not None:
            ticket_id = held.ticket_id
            self._send(Retype(ticket_id, kind))

    def release(self, lease: Lease, ok: bool = True) -> None:
        self._send(Release(lease, ok))

    async def _first(self, ticket: Ticket) -> Lease | QueueStatus:
        answer: SubmitAnswer = await self._answers.pop(ticket.ticket_id)
        if isinstance(answer, Refused):
            error = QueueFullError if answer.reason == "queue_full" else NoWorkersError
            raise error(answer.message)
        if isinstance(answer, Lease):
            ticket.lease = answer
        return answer

    async def _next(
        self, ticket: Ticket, known: QueueStatus, timeout: float
    ) -> Lease | QueueStatus:
        ray = import_ray()
        call = self.registry.wait.remote(self.gateway_id, ticket.ticket_id, known, timeout)
        try:
            progress = await call
        except ray.exceptions.RayError as exc:
            self._lose(exc)
            raise QueueLost(f"the cluster's queue is unreachable: {first_line(exc)}") from None
        if isinstance(progress, Cancelled):
            raise LookupError("ticket cancelled")
        if isinstance(progress, Lease):
            ticket.lease = progress
        return progress

    # --- the mirror ---------------------------------------------------------------

    async def follow(
        self,
        links: dict[str, WorkerLink],
        on_state: Callable[[ClusterState], None],
        on_lost: Callable[[str], None],
    ) -> None:
        """Keep the mirror and ``links`` (the gateway's view of each worker,
        for ``/workers``) as the registry has them, until it is lost."""
        ray = import_ray()
        while self.lost is None:
            call = self.registry.state.remote(self.gateway_id, self.version, STATE_POLL_S)
            try:
                state = await call
            except ray.exceptions.RayError as exc:
                self._lose(exc)
                break
            if state is not None:
                self._adopt(state, links)
                on_state(state)
            await asyncio.sleep(MIRROR_MIN_INTERVAL_S)
        for record in self.scheduler.workers.values():
            record.health = WorkerHealth.OFFLINE
        assert self.lost is not None
        on_lost(self.lost)

    def _adopt(self, state: ClusterState, links: dict[str, WorkerLink]) -> None:
        scheduler = self.scheduler
        scheduler.workers = state.workers
        scheduler.queue = OrderedDict((ticket.ticket_id, ticket) for ticket in state.queue)
        scheduler.max_queue_size = state.max_queue_size
        assert isinstance(scheduler.eta, ForwardingEta)
        scheduler.eta.adopt(state.eta)
        for shown in state.links:
            link = links.get(shown.worker_id)
            if link is None:
                link = links[shown.worker_id] = WorkerLink(
                    shown.worker_id, shown.url, self.settings, self
                )
            link.url = shown.url
            link.last_status = shown.last_status
            link.last_health_at = shown.last_health_at
            link.failure = shown.failure
        self.version = state.version

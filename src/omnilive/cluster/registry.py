"""The registry actor: the one FIFO queue of a cluster, and its workers.

It holds the gateway's own :class:`~omnilive.gateway.pool.Pool` (so the
scheduler, its dispatch and its wait estimates are the same code as on one
host) and a :class:`~omnilive.gateway.links.WorkerLink` per worker, which
follows the worker's control channel and health exactly as a lone gateway
does: a worker whose channel drops is out of rotation at once. Worker actors
register here when they start (and again when Ray restarts them, at a new
address). Gateways change the queue through numbered batches of operations
(:mod:`omnilive.cluster.protocol`) and read it through long polls.

This class is plain Python; :mod:`omnilive.cluster.deploy` makes it a Ray
actor. Every method runs on the actor's event loop.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from dataclasses import dataclass, replace

import httpx

from omnilive.cluster.placement import Placer
from omnilive.cluster.protocol import (
    AdminCancel,
    Cancelled,
    ClusterState,
    LinkState,
    Op,
    Progress,
    Refused,
    Release,
    Retype,
    SetHealth,
    Submit,
    SubmitAnswer,
    UpdateEta,
    Withdraw,
)
from omnilive.config import Settings
from omnilive.gateway.links import WorkerLink, close_quietly
from omnilive.gateway.pool import Pool, QueueStatus
from omnilive.gateway.scheduler import NoWorkersError, QueueFullError, Ticket
from omnilive.gateway.supervisor import GaveUp
from omnilive.logs import configure_logging
from omnilive.serving import ExitCode
from omnilive.tasks import TaskSet

log = logging.getLogger(__name__)

# How long shutdown waits for workers to finish the sessions' recordings.
SETTLE_S = 10.0
REAP_EVERY_S = 1.0


@dataclass
class _Owned:
    gateway_id: str
    ticket: Ticket


@dataclass
class _Gateway:
    last_seen: float
    applied: int = 0  # the batches applied so far; the next one is numbered this
    turn: asyncio.Event | None = None  # set when ``applied`` moves


class Registry:
    """The shared queue and the worker list of one deployment."""

    def __init__(self, settings_json: str) -> None:
        self.settings = Settings.model_validate_json(settings_json)
        configure_logging(
            self.settings.log_level, "registry", self.settings.log_json, self.settings.log_stream
        )
        self.pool = Pool(self.settings)
        self.links: dict[str, WorkerLink] = {}
        self.given_up: dict[str, GaveUp] = {}
        self.registrations: dict[str, int] = {}
        self.version = 0
        self._versioned = asyncio.Event()
        self._tickets: dict[str, _Owned] = {}
        self._gateways: dict[str, _Gateway] = {}
        self._link_tasks: dict[str, list[asyncio.Task[None]]] = {}
        self._tasks = TaskSet("registry")
        self._client: httpx.AsyncClient | None = None
        self._placer = Placer(self.settings, settings_json)
        self._started = False

    def _start(self) -> None:
        """Background work, started on the actor's loop by the first call."""
        if self._started:
            return
        self._started = True
        self._client = httpx.AsyncClient()
        self._tasks.spawn("versions", self._count_versions())
        self._tasks.spawn("reaper", self._reap_silent_gateways())
        self._tasks.spawn("placement", self._placer.run())

    async def ready(self) -> str:
        """Start placing workers; returns the settings gateways need (the
        internal token among them)."""
        self._start()
        return self.settings.to_json()

    # --- workers -------------------------------------------------------------

    async def register_worker(self, worker_id: str, url: str) -> None:
        """A worker actor started (again) and listens at ``url``."""
        self._start()
        self.registrations[worker_id] = self.registrations.get(worker_id, 0) + 1
        await self._drop_link(worker_id)
        self.pool.add_worker(worker_id, url)
        link = self.links[worker_id] = WorkerLink(worker_id, url, self.settings, self.pool)
        assert self._client is not None
        self._link_tasks[worker_id] = [
            self._tasks.spawn(f"control-{worker_id}", link.run_control()),
            self._tasks.spawn(f"health-{worker_id}", link.run_health(self._client)),
        ]
        log.info("worker %s registered at %s", worker_id, url)

    async def _drop_link(self, worker_id: str) -> None:
        old = self._link_tasks.pop(worker_id, [])
        for task in old:
            task.cancel()
        await asyncio.gather(*old, return_exceptions=True)
        if worker_id in self.links:
            self.links[worker_id].mark_offline()

    async def worker_failed(self, worker_id: str, reason: str, code: int) -> None:
        """A worker's engine cannot load: it is not started again."""
        why = f"worker {worker_id} cannot load its engine: {reason}"
        log.error("%s; not starting it again", why)
        self.given_up[worker_id] = GaveUp(worker_id, why, ExitCode(code))
        await self._drop_link(worker_id)
        if worker_id in self.links:
            self.links[worker_id].give_up(why)
        self._placer.retire(worker_id)

    # --- the queue -------------------------------------------------------------

    async def apply(self, gateway_id: str, batch: int, ops: list[Op]) -> list[object]:
        """Apply one numbered batch of a gateway's operations, after all its
        earlier batches; returns one answer per operation."""
        gateway = self._gateway(gateway_id)
        while gateway.applied < batch:  # an earlier batch is still on its way
            gateway.turn = gateway.turn or asyncio.Event()
            await gateway.turn.wait()
        answers = [self._apply_one(gateway_id, op) for op in ops]
        gateway.applied = batch + 1
        if gateway.turn is not None:
            gateway.turn.set()
            gateway.turn = None
        return copy.deepcopy(answers)

    def _apply_one(self, gateway_id: str, op: Op) -> object:
        if isinstance(op, Submit):
            return self._submit(gateway_id, op)
        if isinstance(op, Withdraw):
            owned = self._tickets.pop(op.ticket_id, None)
            if owned is not None:
                self.pool.cancel(owned.ticket)
        elif isinstance(op, AdminCancel):
            self._tickets.pop(op.ticket_id, None)
            return self.pool.cancel_by_id(op.ticket_id)
        elif isinstance(op, Release):
            self._tickets.pop(op.lease.ticket_id, None)
            self.pool.release(op.lease, op.ok)
        elif isinstance(op, SetHealth):
            if op.worker_id in self.pool.scheduler.workers:
                self.pool.set_worker_state(op.worker_id, op.health)
        elif isinstance(op, Retype):
            owned = self._tickets.get(op.ticket_id)
            if owned is not None:
                self.pool.retype(owned.ticket, owned.ticket.lease, op.request_type)
        elif isinstance(op, UpdateEta):
            self.pool.scheduler.eta.update(op.changes)
            self.pool.notify()
        return None

    def _submit(self, gateway_id: str, op: Submit) -> SubmitAnswer:
        try:
            ticket = self.pool.submit(op.request_type, op.session_id, op.ticket_id)
        except QueueFullError as exc:
            return Refused("queue_full", str(exc))
        except NoWorkersError as exc:
            return Refused("no_workers", str(exc))
        self._tickets[ticket.ticket_id] = _Owned(gateway_id, ticket)
        return ticket.lease if ticket.lease is not None else self.pool.status_of(ticket)

    async def wait(
        self, gateway_id: str, ticket_id: str, known: QueueStatus, timeout: float
    ) -> Progress:
        """A waiting ticket's lease once assigned; else its place as soon as it
        differs from ``known``, or the queue changes, or ``timeout`` passes."""
        self._gateway(gateway_id)
        owned = self._tickets.get(ticket_id)
        if owned is None:
            return Cancelled()
        ticket = owned.ticket
        if ticket.lease is None:
            status = self.pool.status_of(ticket)
            if status.shown() != known.shown():
                return status
            try:
                await self.pool.wait(ticket, timeout)
            except LookupError:
                return Cancelled()
        if ticket.lease is not None:
            return replace(ticket.lease)
        return self.pool.status_of(ticket)

    # --- mirrors and heartbeats ------------------------------------------------

    async def state(
        self, gateway_id: str, known_version: int, timeout: float
    ) -> ClusterState | None:
        """The whole state once it differs from ``known_version`` (None after
        ``timeout`` without a change). A gateway polls this all the time: it is
        also how the registry knows that the gateway is alive."""
        self._start()
        self._gateway(gateway_id)
        if known_version == self.version:
            try:
                async with asyncio.timeout(timeout):
                    await self._versioned.wait()
            except TimeoutError:
                return None
        return self._snapshot()

    def _snapshot(self) -> ClusterState:
        scheduler = self.pool.scheduler
        links = [
            LinkState(
                link.worker_id,
                link.url,
                link.last_status,
                link.last_health_at,
                link.failure,
                self.registrations.get(worker_id, 1) - 1,
            )
            for worker_id, link in self.links.items()
        ]
        state = ClusterState(
            self.version,
            scheduler.max_queue_size,
            scheduler.workers,
            list(scheduler.queue.values()),
            scheduler.eta,
            links,
            list(self.given_up.values()),
        )
        # A copy made on the loop: Ray serializes the answer on another thread.
        return copy.deepcopy(state)

    def _gateway(self, gateway_id: str) -> _Gateway:
        gateway = self._gateways.get(gateway_id)
        if gateway is None:
            gateway = self._gateways[gateway_id] = _Gateway(time.monotonic())
            log.info("gateway %s joined", gateway_id)
        gateway.last_seen = time.monotonic()
        return gateway

    async def _count_versions(self) -> None:
        while True:
            await self.pool.next_change().wait()
            self.version += 1
            self._versioned.set()
            self._versioned = asyncio.Event()

    async def _reap_silent_gateways(self) -> None:
        """A gateway that stopped polling is gone (killed, or cut off): its
        waiting tickets leave the queue and its leases come back."""
        limit = self.settings.ray.gateway_timeout_s
        while True:
            await asyncio.sleep(REAP_EVERY_S)
            now = time.monotonic()
            for gateway_id, gateway in list(self._gateways.items()):
                if now - gateway.last_seen <= limit:
                    continue
                dropped = [t for t, o in self._tickets.items() if o.gateway_id == gateway_id]
                log.warning(
                    "gateway %s silent for %.0f s: dropping its %d tickets and leases",
                    gateway_id, now - gateway.last_seen, len(dropped),
                )  # fmt: skip
                for ticket_id in dropped:
                    self.pool.cancel(self._tickets.pop(ticket_id).ticket)
                # Kept (not deleted): a gateway that comes back goes on numbering its batches.
                gateway.last_seen = float("inf")

    # --- shutdown -------------------------------------------------------------

    async def stop(self) -> None:
        """Let workers finish their sessions' recordings, then stop them."""
        settling = [link.wait_settled() for link in self.links.values()]
        try:
            async with asyncio.timeout(SETTLE_S):
                await asyncio.gather(*settling)
        except TimeoutError:
            log.warning("workers still hold sessions after %.0f s; stopping them anyway", SETTLE_S)
        self._placer.stop()
        await self._tasks.close()
        if self._client is not None:
            await close_quietly(self._client)

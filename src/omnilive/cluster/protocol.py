"""What gateways and the registry actor exchange, as typed dataclasses.

A gateway changes the shared queue only through :class:`Op` values, sent in
numbered batches (``Registry.apply``): the registry applies each gateway's
batches in their order, whatever order Ray delivers them in, so a
withdrawal never overtakes its submit and a suspect worker is out of
rotation before its slot is given back. Reading is separate: a waiting
ticket long-polls its progress (``Registry.wait``), and each gateway keeps a
mirror of the whole state for its status pages (``Registry.state``), which is
also its heartbeat.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from omnilive.config import RequestType
from omnilive.gateway.eta import EtaModel
from omnilive.gateway.pool import QueueStatus
from omnilive.gateway.scheduler import Lease, Ticket, WorkerHealth, WorkerRecord
from omnilive.gateway.supervisor import GaveUp
from omnilive.protocol.internal import WorkerStatus


@dataclass(frozen=True)
class Submit:
    ticket_id: str  # named by the gateway, so that it can answer its route at once
    request_type: RequestType
    session_id: str


@dataclass(frozen=True)
class Withdraw:
    """The gateway gave up a ticket (its client left): out of the queue, or its
    lease back if it was assigned meanwhile."""

    ticket_id: str


@dataclass(frozen=True)
class AdminCancel:
    """``DELETE /api/queue/{id}``: whichever gateway holds the client, it is
    woken as cancelled."""

    ticket_id: str


@dataclass(frozen=True)
class Release:
    lease: Lease
    ok: bool


@dataclass(frozen=True)
class SetHealth:
    """A gateway saw a worker fail a session: out of rotation until its next
    status push (a dead worker's slot is not handed out meanwhile)."""

    worker_id: str
    health: WorkerHealth


@dataclass(frozen=True)
class Retype:
    ticket_id: str
    request_type: RequestType


@dataclass(frozen=True)
class UpdateEta:
    changes: dict[str, Any]


Op = Submit | Withdraw | AdminCancel | Release | SetHealth | Retype | UpdateEta


@dataclass(frozen=True)
class Refused:
    """The shared queue refused a submit."""

    reason: Literal["queue_full", "no_workers"]
    message: str


@dataclass(frozen=True)
class Cancelled:
    """The ticket is no longer known: cancelled by an administrator, or
    dropped with a gateway that went silent."""


# A submit's answer, and a wait's.
SubmitAnswer = Lease | QueueStatus | Refused
Progress = Lease | QueueStatus | Cancelled


@dataclass
class LinkState:
    """The registry's view of one worker, for a gateway's ``/workers``."""

    worker_id: str
    url: str
    last_status: WorkerStatus | None
    last_health_at: float | None
    failure: str | None
    restarts: int


@dataclass
class ClusterState:
    """The queue, the leases and the workers, as the registry has them."""

    version: int
    max_queue_size: int
    workers: dict[str, WorkerRecord]
    queue: list[Ticket]
    eta: EtaModel
    links: list[LinkState] = field(default_factory=list)
    given_up: list[GaveUp] = field(default_factory=list)

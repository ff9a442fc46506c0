"""Everything the gateway's routes share, built once in the lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request, WebSocket

from omnilive.config import Settings
from omnilive.engines.base import Capabilities
from omnilive.gateway.links import WorkerLink
from omnilive.gateway.pool import PoolFace
from omnilive.gateway.registry import SessionRegistry
from omnilive.gateway.resume import ResumeTable
from omnilive.gateway.scheduler import WorkerHealth
from omnilive.gateway.supervisor import Supervisor


@dataclass
class Gateway:
    settings: Settings
    pool: PoolFace
    links: dict[str, WorkerLink] = field(default_factory=dict)
    sessions: SessionRegistry = field(default_factory=SessionRegistry)
    # Resume tokens of the streaming sessions (``client_channel.ClientChannel``).
    resumes: ResumeTable[Any] = field(default_factory=ResumeTable)
    supervisor: Supervisor | None = None
    started_at: float = field(default_factory=time.time)
    # Set when a graceful shutdown begins: sessions end with their protocol's
    # shutdown message while the connections are still open.
    shutting_down: asyncio.Event = field(default_factory=asyncio.Event)

    async def drain(self, grace_s: float) -> None:
        """Tell every session the server is going away; wait for them to end."""
        self.shutting_down.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace_s):
                await self.sessions.wait_empty()

    def capabilities(self) -> Capabilities | None:
        """What the workers' engine can do, once a worker has told us."""
        for worker in self.pool.scheduler.workers.values():
            if worker.capabilities and worker.health is not WorkerHealth.OFFLINE:
                return Capabilities.from_dict(worker.capabilities)
        for worker in self.pool.scheduler.workers.values():
            if worker.capabilities:
                return Capabilities.from_dict(worker.capabilities)
        return None

    def engine_name(self) -> str | None:
        statuses = (link.last_status for link in self.links.values())
        return next((status.engine for status in statuses if status is not None), None)


def gateway_of(connection: Request | WebSocket) -> Gateway:
    gateway: Gateway = connection.app.state.gateway
    return gateway

"""Sessions the gateway is serving, by id, so REST calls can reach them."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.client import ClientConnection

from omnilive.config import RequestType
from omnilive.gateway.scheduler import Lease, Ticket
from omnilive.protocol.common import ErrorCode, ProtocolError


@dataclass
class ActiveSession:
    session_id: str
    kind: RequestType
    worker: ClientConnection | None = None
    ticket: Ticket | None = None
    lease: Lease | None = None
    started_at: float = field(default_factory=time.time)
    # The API key that opened it (its fingerprint): only it, or an admin, may
    # control the session over REST.
    owner: str | None = None
    # Its client connection dropped and it waits for a resume (docs/resume.md).
    suspended: bool = False
    recording_id: str | None = None  # its worker's recording, once a message named it

    async def send_control(self, message: dict[str, Any]) -> bool:
        """Inject a control message (e.g. a REST stop) into the worker session."""
        if self.worker is None:
            return False
        await self.worker.send(json.dumps(message))
        return True


class SessionRegistry:
    """Sessions currently served, by id: lets REST calls reach a session."""

    def __init__(self) -> None:
        self._sessions: dict[str, ActiveSession] = {}
        self._empty = asyncio.Event()
        self._empty.set()

    def add(self, session: ActiveSession) -> None:
        if session.session_id in self._sessions:
            raise ProtocolError(ErrorCode.INVALID_REQUEST, "session id is already in use")
        self._sessions[session.session_id] = session
        self._empty.clear()

    def remove(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)
        if not self._sessions:
            self._empty.set()

    async def wait_empty(self) -> None:
        await self._empty.wait()

    def get(self, session_id: str) -> ActiveSession | None:
        return self._sessions.get(session_id)

    def count(self) -> int:
        return len(self._sessions)

    def suspended(self) -> int:
        return sum(1 for session in self._sessions.values() if session.suspended)

    def worker_gone(self, worker_id: str) -> int:
        """The worker is gone (its control channel lost, its process exited):
        the sockets of the sessions it served are dropped, so that each
        session's relay ends at once as its worker lost (a hung worker would
        keep them open, and they carry no pings: ``protocol/internal.py``).
        Returns how many were dropped."""
        dropped = 0
        for session in self._sessions.values():
            worker, lease = session.worker, session.lease
            if worker is None or lease is None or lease.worker_id != worker_id:
                continue
            worker.transport.abort()
            dropped += 1
        return dropped

    def by_kind(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for session in self._sessions.values():
            counts[session.kind] = counts.get(session.kind, 0) + 1
        return counts

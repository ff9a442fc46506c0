"""The gateway's WebRTC calls: how many, whose, and the tasks that run them."""

from __future__ import annotations

import asyncio
from typing import Any

from omnilive.gateway.webrtc.call import ASGIApp, Call, Refused
from omnilive.session_settings import WebRTCSettings
from omnilive.tasks import TaskSet

ACCEPT_TIMEOUT_S = 10.0  # a session's route accepts (or refuses) at once


class TooManyCalls(Exception):
    """``max_peer_connections`` are open."""


class Calls:
    """Open calls by id; each runs as a task of this registry, closed with it."""

    def __init__(self, settings: WebRTCSettings) -> None:
        self.settings = settings
        self._calls: dict[str, tuple[Call, str | None]] = {}
        self._tasks = TaskSet("webrtc")

    def __len__(self) -> int:
        return len(self._calls)

    def admit(self) -> None:
        if len(self._calls) >= self.settings.max_peer_connections:
            limit = self.settings.max_peer_connections
            raise TooManyCalls(f"the gateway holds its limit of {limit} WebRTC peer connections")

    def add(self, call: Call, owner: str | None) -> None:
        """Count ``call`` from its offer on (its answer takes ICE gathering)."""
        self.admit()
        self._calls[call.call_id] = (call, owner)

    def discard(self, call_id: str) -> None:
        self._calls.pop(call_id, None)

    def get(self, call_id: str, owner: str | None, is_admin: bool = False) -> Call | None:
        """The call, if ``owner`` may see it; another key's call is not found either."""
        found = self._calls.get(call_id)
        if found is None or not (is_admin or found[1] == owner):
            return None
        return found[0]

    async def start(self, call: Call, app: ASGIApp) -> Refused | None:
        """Run ``call``'s session; returns once its route accepted it, or how it refused."""

        async def running() -> None:
            try:
                await call.run(app)
            finally:
                self.discard(call.call_id)

        async def forgotten_once_closed() -> None:
            # A call whose session was resumed on a newer call still runs
            # that session (it began there) after its peer connection is
            # closed: it no longer counts against the limit.
            await call.closed.wait()
            self.discard(call.call_id)

        self._tasks.spawn(call.call_id, running())
        self._tasks.spawn(f"{call.call_id}-closed", forgotten_once_closed())
        try:
            async with asyncio.timeout(ACCEPT_TIMEOUT_S):
                return await call.accepted
        except TimeoutError:
            call.close()
            return Refused(1011, "the session did not start")

    def stats(self) -> dict[str, Any]:
        return {"open": len(self._calls), "limit": self.settings.max_peer_connections}

    async def close(self) -> None:
        for call, _owner in list(self._calls.values()):
            call.close()
        await self._tasks.close()

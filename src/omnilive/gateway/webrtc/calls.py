"""The WebRTC calls of one process: how many, whose, and the tasks that run
them. The gateway's registry holds every call it answered, run here or by a
media process (``media_pool.py``); a media process keeps one of its own."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from omnilive.gateway.webrtc.call import ASGIApp, Call, Refused
from omnilive.gateway.webrtc.offer import CallRefused, Offer, OfferError, session_refused
from omnilive.session_settings import WebRTCSettings
from omnilive.tasks import TaskSet

if TYPE_CHECKING:
    from omnilive.gateway.webrtc.media_pool import MediaPool

ACCEPT_TIMEOUT_S = 10.0  # a session's route accepts (or refuses) at once


class TooManyCalls(Exception):
    """``max_peer_connections`` are open."""


class CallHandle(Protocol):
    """What the registry needs of a call: its id, and a way to end it."""

    call_id: str

    def close(self) -> None: ...


class Calls:
    """Open calls by id; each call run here is a task of this registry, closed
    with it. ``on_gone`` hears of every call the registry forgets."""

    def __init__(
        self,
        settings: WebRTCSettings,
        media: MediaPool | None = None,
        on_gone: Callable[[str], None] | None = None,
    ) -> None:
        self.settings = settings
        self.media = media  # the media processes that run the calls; None: this process
        self.on_gone = on_gone
        self._calls: dict[str, tuple[CallHandle, str | None]] = {}
        self._tasks = TaskSet("webrtc")

    def __len__(self) -> int:
        return len(self._calls)

    def admit(self) -> None:
        if len(self._calls) >= self.settings.max_peer_connections:
            limit = self.settings.max_peer_connections
            raise TooManyCalls(f"the gateway holds its limit of {limit} WebRTC peer connections")

    def add(self, call: CallHandle, owner: str | None) -> None:
        """Count ``call`` from its offer on (its answer takes ICE gathering)."""
        self.admit()
        self._calls[call.call_id] = (call, owner)

    def discard(self, call_id: str) -> None:
        if self._calls.pop(call_id, None) is not None and self.on_gone is not None:
            self.on_gone(call_id)

    def get(self, call_id: str, owner: str | None, is_admin: bool = False) -> CallHandle | None:
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
        stats = {"open": len(self._calls), "limit": self.settings.max_peer_connections}
        return stats if self.media is None else {**stats, **self.media.stats()}

    async def close(self) -> None:
        for call, _owner in list(self._calls.values()):
            call.close()
        await self._tasks.close()
        if self.media is not None:
            await self.media.close()


async def open_here(calls: Calls, call: Call, owner: str | None, offer: Offer, app: ASGIApp) -> str:
    """Answer ``offer`` with ``call``, run in this process: the SDP answer
    once its session began, or :class:`CallRefused`. A call that does not
    start gives its place under ``max_peer_connections`` back at once."""
    try:
        calls.add(call, owner)
    except TooManyCalls as exc:
        await call.abandon()
        raise CallRefused(503, "too_many_peer_connections", str(exc)) from None
    started = False
    try:
        answer = await call.answer(offer)
        refused = await calls.start(call, app)
        started = True  # the call's task owns it now, and frees its place
    except OfferError as exc:
        raise CallRefused(exc.status, exc.code, exc.message) from None
    finally:
        if not started:  # refused, or the client left: its place is free again
            calls.discard(call.call_id)
            await call.abandon()
    if refused is not None:
        raise session_refused(refused.code, refused.reason)
    return answer

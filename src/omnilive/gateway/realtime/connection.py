"""What every Realtime API connection does the same way, whatever its mode:
register, queue for a worker while reading the client, carry out the
machine's actions, end on time, on shutdown, or when asked.

Subclasses (``session.py`` for video and audio,
``chat.py`` for chat) hold the machine and say what to do once
the session has its worker.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
from typing import Any

from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect

from omnilive.gateway.app_gate import CLOSE_POLICY_VIOLATION
from omnilive.gateway.auth import principal_of
from omnilive.gateway.client_channel import ClientChannel
from omnilive.gateway.client_ws import CLOSE_TRY_AGAIN, close_quietly, send_json
from omnilive.gateway.lifecycle import Ending
from omnilive.gateway.realtime.machine import Close, ToClient, ToWorker
from omnilive.gateway.registry import ActiveSession
from omnilive.gateway.resume_link import client_channel
from omnilive.gateway.session_link import (
    ServerShutdown,
    SessionLink,
    WorkerSocket,
    gateway_session,
)
from omnilive.gateway.session_link import ToClient as RelayToClient
from omnilive.gateway.state import Gateway
from omnilive.logs import bind_session
from omnilive.protocol.realtime import CloseReason, RealtimeErrorCode, error_event


def openai_error_kind(code: RealtimeErrorCode) -> str:
    """The ``error.type`` of a server-side refusal in OpenAI's dialects: a
    disabled app is the client's request, the rest the server's."""
    return "invalid_request_error" if code is RealtimeErrorCode.APP_DISABLED else "server_error"


class SessionDone(Exception):
    """Raised inside the session to end it after its actions were carried out."""


class RealtimeIO(abc.ABC):
    """One client connection, from accept to close."""

    machine: Any  # the protocol's machine: session_id, task_type, queue_event, end
    limit_s: float
    resumable = True  # a dropped connection suspends the session (docs/resume.md)

    def __init__(self, gateway: Gateway, ws: WebSocket) -> None:
        self.gateway = gateway
        # The client: its socket until run() opens the session's channel.
        self.ws: WebSocket | ClientChannel = ws
        self.worker: WorkerSocket | None = None  # the session's socket to its worker, once open

    @abc.abstractmethod
    def client_frame(self, raw: str | bytes) -> list[Any]:
        """The machine's actions for one client frame."""

    @abc.abstractmethod
    async def serve_leased(self, link: SessionLink) -> None:
        """The session once it has its worker."""

    async def act(self, action: Any) -> None:
        """An action beyond sending and closing: a message for the worker, or
        a subclass's own."""
        if isinstance(action, ToWorker):
            if self.worker is not None:
                await self.worker.send(json.dumps(action.message))
            return
        raise TypeError(f"unexpected action {action!r}")

    async def relay_leased(
        self, link: SessionLink, to_client: RelayToClient, kind: Any = None
    ) -> Ending | None:
        """Open the session on its worker (``kind``: the session's own unless
        named), hand the machine's first messages to it, then relay the
        worker's events while reading the client. How the worker ended it,
        or None if the client left first."""
        async with link.worker(kind) as worker:
            self.worker = worker
            try:
                await self.apply(self.machine.attach_worker())
                name = f"{self.machine.session_id}:from-worker"
                relay = asyncio.create_task(worker.relay(to_client), name=name)
                self._channel().set_resumable(True)
                ending: Ending | None = await self.while_reading(relay)
                return ending
            finally:
                self._channel().set_resumable(False)
                self.worker = None

    # --- actions -------------------------------------------------------------------

    async def send(self, event: dict[str, Any]) -> None:
        await send_json(self.ws, event)

    async def apply(self, actions: list[Any]) -> None:
        for action in actions:
            if isinstance(action, ToClient):
                await self.send(action.event)
            elif isinstance(action, Close):
                await close_quietly(self.ws, action.code, action.reason)
                raise SessionDone()
            else:
                await self.act(action)

    def refusal_event(self, code: RealtimeErrorCode, message: str) -> dict[str, Any]:
        """A server-side refusal or end as the dialect's ``error`` event."""
        return error_event(code, message)

    async def refuse(self, code: RealtimeErrorCode, message: str) -> None:
        """A server-side refusal: error, then close 1013 (try again later)."""
        with contextlib.suppress(WebSocketDisconnect, OSError, RuntimeError):
            await self.send(self.refusal_event(code, message))
        await close_quietly(self.ws, CLOSE_TRY_AGAIN)

    async def end(self, reason: CloseReason) -> None:
        with contextlib.suppress(SessionDone, WebSocketDisconnect, OSError, RuntimeError):
            await self.apply(self.machine.end(reason))

    async def tell(self, ending: Ending, detail: str) -> None:
        """How the Realtime API tells a client that the gateway ended its session."""
        if ending is Ending.SHUTDOWN:
            await self.end(CloseReason.SERVER_SHUTDOWN)
        elif ending in _REFUSALS:
            await self.refuse(_REFUSALS[ending], detail)
        elif ending is Ending.APP_DISABLED:
            await self.send(self.refusal_event(RealtimeErrorCode.APP_DISABLED, detail))
            await close_quietly(self.ws, CLOSE_POLICY_VIOLATION)
        else:  # lost, cancelled, a bug
            if self.machine.dialect == "realtime":  # the newer dialect has no error events
                await self.send(error_event(RealtimeErrorCode.SERVICE_UNAVAILABLE, detail))
            await self.end(CloseReason.ERROR)

    # --- the session ---------------------------------------------------------------------

    async def opened(self) -> None:
        """What the dialect sends first, before the session queues (the
        MiniCPM-o dialects: nothing; their first event is a queue event)."""
        return None

    def _channel(self) -> ClientChannel:
        assert isinstance(self.ws, ClientChannel), "run() first"
        return self.ws

    async def run(self) -> None:
        bind_session(self.machine.session_id)
        owner = principal_of(self.ws).key_id
        session = ActiveSession(self.machine.session_id, self.machine.task_type, owner=owner)
        ws = self.ws
        assert not isinstance(ws, ClientChannel)
        async with client_channel(self.gateway, ws, session, "realtime", self.resumable) as channel:
            self.ws = channel
            await self.opened()
            async with gateway_session(self.gateway, session, self.tell, channel) as link:
                try:
                    async with asyncio.timeout(self.limit_s):
                        await self._serve(link)
                except TimeoutError:
                    await self.end(CloseReason.TIMEOUT)
                    link.end(Ending.DONE)
                except SessionDone:  # the machine closed it: the protocol's own end
                    link.end(Ending.DONE)

    async def _serve(self, link: SessionLink) -> None:
        if not link.submit():
            return

        async def queue_to_client(message: dict[str, Any]) -> None:
            queued = self.machine.queue_event(message)
            await self.apply(queued if isinstance(queued, list) else [queued])

        name = self.machine.session_id
        waiting = asyncio.create_task(
            link.acquire(queue_to_client, always_done=True), name=f"{name}:queue"
        )
        if await self.while_reading(waiting) is not None:
            await self.serve_leased(link)

    async def while_reading(self, work: asyncio.Task[Any]) -> Any:
        """Run ``work`` while reading the client (through the machine); returns
        its result, or None if the client left first. Raises
        ``ServerShutdown`` when the gateway starts shutting down meanwhile."""
        name = self.machine.session_id
        reader = asyncio.create_task(self._read_client(), name=f"{name}:from-client")
        shutdown = asyncio.create_task(self.gateway.shutting_down.wait(), name=f"{name}:shutdown")
        try:
            done, _ = await asyncio.wait([work, reader, shutdown], return_when="FIRST_COMPLETED")
        finally:
            for task in (work, reader, shutdown):
                task.cancel()
            await asyncio.gather(work, reader, shutdown, return_exceptions=True)
        if shutdown in done:
            raise ServerShutdown()
        if reader in done and reader.exception():
            raise reader.exception()  # type: ignore[misc]  # not None: checked above
        if work in done:
            return work.result()
        return None

    async def _read_client(self) -> None:
        async for raw in self._channel().frames():
            await self.apply(self.client_frame(raw))


# Server-side refusals: an error with this code, then close 1013 (try again).
_REFUSALS = {
    Ending.QUEUE_FULL: RealtimeErrorCode.QUEUE_FULL,
    Ending.NO_WORKERS: RealtimeErrorCode.SERVICE_UNAVAILABLE,
    Ending.WORKER_BUSY: RealtimeErrorCode.WORKER_BUSY,
    Ending.WORKER_UNREACHABLE: RealtimeErrorCode.WORKER_CONNECT_FAILED,
}

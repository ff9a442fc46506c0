"""What every Realtime API connection does the same way, whatever its mode:
register, queue for a worker while reading the client, carry out the
machine's actions, end on time, on shutdown, or when asked.

Subclasses (``realtime_session.py`` for video and audio,
``realtime_chat.py`` for chat) hold the machine and say what to do once
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

from omnilive.gateway.client_ws import CLOSE_TRY_AGAIN, close_quietly
from omnilive.gateway.realtime_machine import Close, ToClient
from omnilive.gateway.registry import ActiveSession
from omnilive.gateway.scheduler import Lease, NoWorkersError, QueueFullError
from omnilive.gateway.state import Gateway
from omnilive.logs import bind_session
from omnilive.protocol.realtime import CloseReason, RealtimeErrorCode, error_event
from omnilive.wsutil import frames_of


class SessionDone(Exception):
    """Raised inside the session to end it after its actions were carried out."""


class RealtimeIO(abc.ABC):
    """One client connection, from accept to close."""

    machine: Any  # the protocol's machine: session_id, task_type, queue_event, end
    limit_s: float

    def __init__(self, gateway: Gateway, ws: WebSocket) -> None:
        self.gateway = gateway
        self.ws = ws

    @abc.abstractmethod
    def client_frame(self, raw: str | bytes) -> list[Any]:
        """The machine's actions for one client frame."""

    @abc.abstractmethod
    async def serve_leased(self, session: ActiveSession, lease: Lease) -> None:
        """The session once it has its worker."""

    async def act(self, action: Any) -> None:
        """An action beyond sending and closing (a subclass's own)."""
        raise TypeError(f"unexpected action {action!r}")

    # --- actions -------------------------------------------------------------------

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send_text(json.dumps(event))

    async def apply(self, actions: list[Any]) -> None:
        for action in actions:
            if isinstance(action, ToClient):
                await self.send(action.event)
            elif isinstance(action, Close):
                await close_quietly(self.ws, action.code)
                raise SessionDone()
            else:
                await self.act(action)

    async def refuse(self, code: RealtimeErrorCode, message: str) -> None:
        """A server-side refusal: error, then close 1013 (try again later)."""
        with contextlib.suppress(WebSocketDisconnect, OSError, RuntimeError):
            await self.send(error_event(code, message))
        await close_quietly(self.ws, CLOSE_TRY_AGAIN)

    async def end(self, reason: CloseReason) -> None:
        with contextlib.suppress(SessionDone, WebSocketDisconnect, OSError, RuntimeError):
            await self.apply(self.machine.end(reason))

    # --- the session ---------------------------------------------------------------------

    async def run(self) -> None:
        bind_session(self.machine.session_id)
        session = ActiveSession(self.machine.session_id, self.machine.task_type)
        self.gateway.sessions.add(session)
        try:
            async with asyncio.timeout(self.limit_s):
                await self._serve(session)
        except TimeoutError:
            await self.end(CloseReason.TIMEOUT)
        except SessionDone:
            pass
        except (WebSocketDisconnect, OSError):
            return
        finally:
            self.gateway.sessions.remove(self.machine.session_id)

    async def _serve(self, session: ActiveSession) -> None:
        pool = self.gateway.pool
        try:
            ticket = session.ticket = pool.submit(self.machine.task_type, self.machine.session_id)
        except QueueFullError as exc:
            await self.refuse(RealtimeErrorCode.QUEUE_FULL, str(exc))
            return
        except NoWorkersError as exc:
            await self.refuse(RealtimeErrorCode.SERVICE_UNAVAILABLE, str(exc))
            return

        async def queue_to_client(message: dict[str, Any]) -> None:
            queued = self.machine.queue_event(message)
            await self.apply(queued if isinstance(queued, list) else [queued])

        waiting = asyncio.ensure_future(pool.acquire(ticket, queue_to_client, always_done=True))
        lease = await self.while_reading(waiting)
        if lease is None:
            return
        session.lease = lease
        await self.serve_leased(session, lease)

    async def while_reading(self, work: asyncio.Future[Any]) -> Any:
        """Run ``work`` while reading the client (through the machine) and
        watching for shutdown; returns its result, or None if the session ended."""
        reader = asyncio.ensure_future(self._read_client())
        shutdown = asyncio.ensure_future(self.gateway.shutting_down.wait())
        try:
            await asyncio.wait([work, reader, shutdown], return_when="FIRST_COMPLETED")
        finally:
            for task in (work, reader, shutdown):
                if not task.done():
                    task.cancel()
            await asyncio.gather(work, reader, shutdown, return_exceptions=True)
        if shutdown.done() and not shutdown.cancelled():
            await self.end(CloseReason.SERVER_SHUTDOWN)
            return None
        if reader.done() and not reader.cancelled() and reader.exception():
            raise reader.exception()  # type: ignore[misc]
        if work.done() and not work.cancelled():
            return work.result()
        return None

    async def _read_client(self) -> None:
        async for raw in frames_of(self.ws):
            await self.apply(self.client_frame(raw))

"""A Realtime API chat session (``mode=chat``): the I/O around its machine.

The session holds one worker slot from ``session.queue_done`` to its end and
serves each turn as a ``/ws/chat`` request on that worker, one at a time.
It ends when the client closes it, after ``realtime.chat_max_s`` in all, when
it is not initialised within ``limits.first_message_timeout_s`` of getting its
worker, or after ``realtime.chat_idle_s`` without a question.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from fastapi import WebSocket

from omnilive.gateway.bridge import (
    WorkerConnectError,
)
from omnilive.gateway.lifecycle import Ending
from omnilive.gateway.realtime.chat_machine import (
    CancelTurn,
    ChatState,
    RealtimeChatMachine,
    StartTurn,
)
from omnilive.gateway.realtime.connection import RealtimeIO, SessionDone
from omnilive.gateway.routes.chat import check_chat
from omnilive.gateway.session_link import SessionLink
from omnilive.gateway.state import Gateway
from omnilive.ids import mint_realtime
from omnilive.protocol.chat import ChatRequest
from omnilive.protocol.common import ProtocolError
from omnilive.protocol.internal import Envelope
from omnilive.protocol.realtime import CloseReason

log = logging.getLogger(__name__)
WATCH_INTERVAL_S = 0.25


class RealtimeChatConnection(RealtimeIO):
    resumable = False  # turn-based over a request each: nothing to hold (docs/resume.md)

    def __init__(self, gateway: Gateway, ws: WebSocket) -> None:
        super().__init__(gateway, ws)
        self.machine = RealtimeChatMachine(
            mint_realtime(), self._check, gateway.settings.limits.max_message_bytes
        )
        self.limit_s = gateway.settings.realtime.chat_max_s
        self.link: SessionLink | None = None
        # Turns run one after another, each only once the previous one's
        # worker socket is closed; the machine bounds how many wait.
        self._turns: asyncio.Queue[StartTurn] = asyncio.Queue()
        self._turn: asyncio.Task[None] | None = None
        self._over = asyncio.Event()  # a turn ended the session
        self._quiet_since = time.monotonic()

    def _check(self, data: dict[str, Any]) -> ChatRequest:
        try:
            return check_chat(self.gateway, data)
        except ProtocolError as exc:
            raise ValueError(exc.message) from None

    def client_frame(self, raw: str | bytes) -> list[Any]:
        actions: list[Any] = self.machine.client_frame(raw)
        return actions

    async def act(self, action: Any) -> None:
        if isinstance(action, StartTurn):
            self._turns.put_nowait(action)
        elif isinstance(action, CancelTurn):
            if self._turn is not None and self._turn is not asyncio.current_task():
                self._turn.cancel()
        else:
            await super().act(action)

    async def serve_leased(self, link: SessionLink) -> None:
        self.link = link
        self._quiet_since = time.monotonic()
        name = self.machine.session_id
        turns = asyncio.create_task(self._serve_turns(), name=f"{name}:turns")
        try:
            await self.while_reading(asyncio.create_task(self._watch(), name=f"{name}:watch"))
        finally:
            turns.cancel()
            await asyncio.gather(turns, return_exceptions=True)

    async def _serve_turns(self) -> None:
        try:
            while True:
                start = await self._turns.get()
                name = f"{self.machine.session_id}:turn-{start.serial}"
                self._turn = asyncio.create_task(self._serve_turn(start), name=name)
                # Its failures are handled inside it (logged once, the session ends).
                await asyncio.wait([self._turn])
        finally:
            if self._turn is not None and not self._turn.done():
                self._turn.cancel()
                await asyncio.gather(self._turn, return_exceptions=True)

    async def _watch(self) -> None:
        """Until a turn ends the session, or the client keeps the worker idle:
        not initialised in time, or no question for too long."""
        settings = self.gateway.settings
        while not self._over.is_set():
            quiet = time.monotonic() - self._quiet_since
            if self.machine.state is ChatState.RESPONDING:
                self._quiet_since = time.monotonic()
            elif (
                self.machine.state is ChatState.CONNECTED
                and (quiet > settings.limits.first_message_timeout_s)
            ) or quiet > settings.realtime.chat_idle_s:
                await self.end(CloseReason.TIMEOUT)
                if self.link is not None:
                    self.link.end(Ending.DONE)
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._over.wait(), WATCH_INTERVAL_S)

    async def _serve_turn(self, start: StartTurn) -> None:
        link = self.link
        assert link is not None and link.lease is not None
        settings = self.gateway.settings

        async def to_machine(_: Envelope, raw: str) -> None:
            await self.apply(self.machine.worker_message(raw))

        try:
            async with asyncio.timeout(settings.request_timeout_s):
                async with link.worker("chat") as worker:
                    await worker.send(start.request.model_dump_json())
                    ending = await worker.relay(to_machine)
            if self.machine.answering(start.serial):  # it ended without ``done``
                why = f"worker {link.lease.worker_id} ended the answer: {ending.value}"
                await self.apply(self.machine.turn_lost(why))
        except WorkerConnectError as exc:
            link.end(Ending.WORKER_UNREACHABLE, str(exc))
            await self._finish(self.machine.turn_lost(str(exc)))
        except TimeoutError:
            await self._finish(self.machine.turn_lost("the answer took too long"))
        except SessionDone:
            self._over.set()
        except Exception as exc:  # a bug: logged once, and the session ends
            log.exception("chat turn of %s failed", self.machine.session_id)
            link.end(Ending.INTERNAL_ERROR, f"internal error: {exc}")
            await self._finish(self.machine.turn_lost("internal error"))
        finally:
            self._quiet_since = time.monotonic()

    async def _finish(self, actions: list[Any]) -> None:
        with contextlib.suppress(SessionDone):
            await self.apply(actions)
        self._over.set()

"""A streaming session's way to its client, across connections.

Session code sends and closes through a :class:`ClientChannel` as it would
through the client's WebSocket (``send_json``, ``fail`` and ``close_quietly``
take either). Every event goes into the session's :class:`ReplayLog` and a
writer task, one per connection, sends the log to the socket in order. When
the connection drops while the session is resumable, :meth:`frames` does not
end: the session is *suspended* (its worker, context and recording held) for
the grace period, and a connection that resumes it (``resume_link.py``)
is attached, told what it missed (``session.resumed``) and sent the events
after the last one it received. A resume while the old connection still
looks alive (a network that dropped packets without a close) takes over: the
old socket is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from omnilive.gateway.registry import ActiveSession
from omnilive.gateway.resume import RESUMED_TYPE, ReplayLog, ResumeTable
from omnilive.wsutil import receive_frame

log = logging.getLogger(__name__)

CLOSE_RESUMED_ELSEWHERE = 4000  # the old socket of a session resumed on a new one
CLOSE_ABNORMAL = 1006  # no Close frame came: the network dropped
FLUSH_TIMEOUT_S = 5.0  # at close: how long the last events may take to go out
_SEND_ERRORS = (WebSocketDisconnect, OSError, RuntimeError)


@dataclass
class Arrival:
    """A connection that resumes the session, handed over by its own handler,
    which waits on ``released`` (its socket must stay open meanwhile)."""

    ws: WebSocket
    last_seq: int
    token: str  # the session's token, told again in ``session.resumed``
    released: asyncio.Event = field(default_factory=asyncio.Event)
    attached: bool = False
    superseded: bool = False  # a newer resume took its place before it was attached


class ClientChannel:
    """One session's client side: the current socket, the replay log, resumes."""

    def __init__(
        self,
        ws: WebSocket,
        session: ActiveSession,
        table: ResumeTable[ClientChannel],
        route: str,
        grace_s: float,
        max_events: int,
        max_bytes: int,
    ) -> None:
        self.ws = ws
        self.session = session
        self.table = table
        self.grace_s = grace_s
        self.log = ReplayLog(max_events, max_bytes, numbered=ws.query_params.get("seq") == "1")
        if grace_s > 0:
            token = table.mint(self, session.owner, route)
            self.log.first_fields = {"resume_token": token, "resume_grace_s": grace_s}
        self.attached = True
        self.resumes = 0
        # The recording's marks of where the client was away (docs/resume.md).
        self.gaps: list[dict[str, Any]] = []
        self.last_frame_at = time.monotonic()
        self._sent = 0  # the last seq the current writer sent
        self._appended = asyncio.Event()
        self._progress = asyncio.Event()
        self._switch = asyncio.Event()  # a resume arrived, or the writer lost the socket
        self._arrival: Arrival | None = None
        self._current: Arrival | None = None  # the resumed connection in use, if any
        self._receive: asyncio.Task[str | bytes] | None = None  # a receive in flight
        self._left_code: int | None = None  # the close code the client left with
        self._writer: asyncio.Task[None] | None = self._start_writer(ws, 0)

    # --- the WebSocket face session code uses ------------------------------------------

    @property
    def scope(self) -> Any:
        return self.ws.scope

    @property
    def client_state(self) -> WebSocketState:
        return self.ws.client_state if self.attached else WebSocketState.DISCONNECTED

    async def send_text(self, text: str) -> None:
        """Log the event; the writer sends it. While the client is attached
        and far behind, wait (the worker feels the back-pressure as before);
        while suspended, never (the log drops its oldest)."""
        self.log.append(text)
        self._appended.set()
        while self.attached and self._behind():
            self._progress.clear()
            await self._progress.wait()

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        """Send what is logged (for a while), then close the current socket."""
        if self.attached and self._writer is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FLUSH_TIMEOUT_S):
                    while self._sent < self.log.last_seq and not self._writer.done():
                        self._progress.clear()
                        await self._progress.wait()
        await self._stop_writer()
        if self.ws.client_state is WebSocketState.CONNECTED:
            with contextlib.suppress(*_SEND_ERRORS):
                await self.ws.close(code=code, reason=reason)

    def _behind(self) -> bool:
        unsent = self.log.last_seq - self._sent
        return unsent > self.log.max_events // 2 or (
            unsent > 1 and self.log.bytes_after(self._sent) > self.log.max_bytes // 2
        )

    # --- resumability ---------------------------------------------------------------

    def set_resumable(self, resumable: bool) -> None:
        """Resumes are taken only while the session has its worker."""
        self.table.set_open(self, resumable and self.grace_s > 0)

    def hand_over(self, ws: WebSocket, last_seq: int, token: str) -> Arrival:
        """Called by a resuming connection's handler once it claimed the token."""
        if self._arrival is not None:  # the newest resume wins over one not yet attached
            self._arrival.superseded = True
            self._arrival.released.set()
        self._arrival = Arrival(ws, last_seq, token)
        self._switch.set()
        return self._arrival

    async def frames(self) -> AsyncGenerator[str | bytes, None]:
        """Every frame the client sends, across resumes; ends when the client
        is gone for good: it left and no resume came within the grace period
        (or the session was not resumable)."""
        while True:
            async for frame in self._frames_of_current():
                self.last_frame_at = time.monotonic()
                yield frame
            if not await self._resumed():
                return

    async def _frames_of_current(self) -> AsyncIterator[str | bytes]:
        """The current socket's frames until it is gone or taken over. A
        receive in flight is never cancelled here (a frame it had taken
        would be lost): it stays for the next reader of the same socket."""
        switch = asyncio.create_task(self._switch.wait(), name="client:switch")
        try:
            while not self._switch.is_set():
                if self._receive is None:
                    name = f"{self.session.session_id}:receive"
                    self._receive = asyncio.create_task(receive_frame(self.ws), name=name)
                receive = self._receive
                await asyncio.wait([receive, switch], return_when="FIRST_COMPLETED")
                if not receive.done():
                    return
                self._receive = None
                if isinstance(receive.exception(), WebSocketDisconnect):
                    self._left_code = receive.exception().code  # type: ignore[union-attr]  # checked above
                    return
                yield receive.result()  # raises what receive_frame raised, if anything
        finally:
            switch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await switch

    async def _resumed(self) -> bool:
        """The current socket is gone (or taken over): suspend, and wait for
        a resume. True once a resumed connection is attached."""
        if self._arrival is None and (not self.table_open() or self._left_on_purpose()):
            return False
        await self._detach()
        self.gaps.append({"dropped_at": time.time(), "resumed_at": None, "input_gap_ms": None})
        if self._arrival is None:
            self._switch.clear()  # set by a writer that lost the socket
            self.session.suspended = True
            log.info("session %s suspended for %g s", self.session.session_id, self.grace_s)
            try:
                async with asyncio.timeout(self.grace_s):
                    await self._switch.wait()
            except TimeoutError:
                log.info("session %s: no resume within %g s", self.session.session_id,
                         self.grace_s)  # fmt: skip
                return False
            finally:
                self.session.suspended = False
        await self._attach()
        return True

    def _left_on_purpose(self) -> bool:
        """Any Close frame ends the session, whatever its code (an empty one
        is 1005; one the server sent, 1009 for an oversized frame, counts
        too): somebody ended it. Only a connection lost without one (1006,
        or a socket that failed under the writer) is held for a resume."""
        return self._left_code is not None and self._left_code != CLOSE_ABNORMAL

    def table_open(self) -> bool:
        return self.grace_s > 0 and self.table.is_open(self)

    async def _detach(self) -> None:
        self.attached = False
        self._progress.set()  # a send waiting for this socket to catch up stops waiting
        await self._stop_writer()
        await self._stop_receive()  # frames sent into the old socket are lost
        if self.ws.client_state is WebSocketState.CONNECTED:  # taken over while alive
            with contextlib.suppress(*_SEND_ERRORS):
                await self.ws.close(CLOSE_RESUMED_ELSEWHERE, "resumed on another connection")
        if self._current is not None:
            self._current.released.set()
            self._current = None

    async def _attach(self) -> None:
        arrival = self._arrival
        assert arrival is not None
        self._arrival = None
        self._switch.clear()
        self._current = arrival
        self._left_code = None
        arrival.attached = True
        self.ws = arrival.ws
        self.resumes += 1
        last = min(arrival.last_seq, self.log.last_seq)
        gap_ms = round((time.monotonic() - self.last_frame_at) * 1000)
        self.gaps[-1].update(resumed_at=time.time(), input_gap_ms=gap_ms)
        resumed = {
            "type": RESUMED_TYPE,
            "session_id": self.session.session_id,
            "resume_token": arrival.token,
            "last_seq": self.log.last_seq,
            "replayed": max(0, self.log.last_seq - last - self.log.missing(last)),
            "events_lost": self.log.missing(last),
            "input_gap_ms": gap_ms,
        }
        self.attached = True
        with contextlib.suppress(*_SEND_ERRORS):  # gone again: the reader finds out
            await arrival.ws.send_text(json.dumps(resumed))
        self._writer = self._start_writer(arrival.ws, last + self.log.missing(last))

    # --- the writer -----------------------------------------------------------------

    def _start_writer(self, ws: WebSocket, after: int) -> asyncio.Task[None]:
        self._sent = after
        name = f"{self.session.session_id}:to-client"
        return asyncio.create_task(self._write(ws), name=name)

    async def _write(self, ws: WebSocket) -> None:
        try:
            while True:
                batch = self.log.after(self._sent)
                if not batch:
                    self._appended.clear()
                    await self._appended.wait()
                    continue
                for seq, text in batch:
                    await ws.send_text(text)
                    self._sent = seq
                    self._progress.set()
        except _SEND_ERRORS:
            self._switch.set()  # the reader stops waiting on this socket
        finally:
            self._progress.set()

    async def _stop_writer(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer

    async def _stop_receive(self) -> None:
        receive, self._receive = self._receive, None
        if receive is not None:
            receive.cancel()
            await asyncio.gather(receive, return_exceptions=True)

    async def aclose(self) -> None:
        """The session is over: its token stops working; a resumed
        connection's handler is let go."""
        self.table.forget(self)
        await self._stop_writer()
        await self._stop_receive()
        for arrival in (self._current, self._arrival):
            if arrival is not None:
                arrival.released.set()

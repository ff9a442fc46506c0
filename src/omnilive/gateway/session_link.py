"""The one path every session takes through the gateway: registered, queued,
leased, linked to its worker, closed.

::

    async with gateway_session(gateway, session, tell) as link:
        lease = await link.acquire(send_queue_message)
        async with link.worker() as worker:
            await worker.send(first_message)
            link.end(await worker.relay(to_client))

Routes differ only in what they relay and in ``tell``: how their protocol
tells a client that the gateway ended its session (an ``error`` and a close
code, a Realtime event, an HTTP status). How the session ended and what that
means for its slot, the ETA model and its recording is decided once, by the
:class:`~omnilive.gateway.lifecycle.SessionLifecycle` machine this drives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from starlette.websockets import WebSocketDisconnect
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from omnilive.config import RequestType
from omnilive.gateway.app_gate import AppDisabled
from omnilive.gateway.bridge import (
    SessionEnd,
    WorkerConnectError,
    open_worker_session,
    relay_to_client,
)
from omnilive.gateway.lifecycle import (
    Ending,
    RecoverRecording,
    ReleaseLease,
    SessionLifecycle,
    TellClient,
)
from omnilive.gateway.observe import session_observer
from omnilive.gateway.pool import SendJson
from omnilive.gateway.registry import ActiveSession
from omnilive.gateway.scheduler import Lease, NoWorkersError, QueueFullError, Ticket, WorkerHealth
from omnilive.gateway.state import Gateway
from omnilive.protocol.internal import Envelope
from omnilive.recording.recovery import recover_abandoned
from omnilive.wsutil import PeerGone, race

if TYPE_CHECKING:
    from omnilive.gateway.client_ws import ClientSocket

log = logging.getLogger(__name__)
T = TypeVar("T")

# How a route tells its client that the gateway ended the session.
Tell = Callable[[Ending, str], Awaitable[None]]
# Receives each worker message: what the gateway reads of it, and the
# client's message as the worker wrote it (relayed untouched).
ToClient = Callable[[Envelope, str], Awaitable[None]]

SHUTDOWN_MESSAGE = "the server is shutting down; reconnect shortly"
CANCELLED_MESSAGE = "removed from the queue by an administrator"

_WORKER_ENDS = {
    SessionEnd.OK: Ending.DONE,
    SessionEnd.FAILED: Ending.FAILED,
    SessionEnd.REFUSED: Ending.WORKER_BUSY,
    SessionEnd.LOST: Ending.WORKER_LOST,
}


class ServerShutdown(Exception):
    """The gateway began a graceful shutdown while the session was open."""


async def until_shutdown(gateway: Gateway, work: Awaitable[T]) -> T:
    """``work``'s result, or :class:`ServerShutdown` if the gateway starts
    shutting down first (``work`` is then cancelled)."""
    try:
        return await race(work, gateway.shutting_down.wait)
    except PeerGone:
        raise ServerShutdown() from None


class WorkerSocket:
    """The session's open socket to its worker."""

    def __init__(self, connection: ClientConnection, session: SessionLink) -> None:
        self.connection = connection
        self._session = session

    async def send(self, raw: str | bytes) -> None:
        """Send to the worker. Once it has closed the session, what the client
        still sends is dropped: the relay reports how the session ended."""
        with contextlib.suppress(ConnectionClosed):
            await self.connection.send(raw)

    async def relay(self, to_client: ToClient) -> Ending:
        """Hand every worker message to ``to_client`` until the worker closes
        the socket; returns how the worker ended it."""
        envelopes: list[Envelope] = []  # the envelope of the message in hand

        def observe(envelope: Envelope) -> None:
            self._session.lifecycle.note_recording(envelope.recording_id)
            self._session.session.recording_id = self._session.lifecycle.recording_id
            envelopes[:] = [envelope]

        async def forward(payload: str) -> None:
            await to_client(envelopes[0], payload)

        end = await relay_to_client(self.connection, forward, observe, self._session.client)
        ending = _WORKER_ENDS[end]
        # These end the session, whatever its route does next.
        if ending is Ending.WORKER_LOST:
            self._session.end(ending, self._session.worker_failed_detail())
        elif ending is Ending.WORKER_BUSY:
            self._session.end(ending, f"worker {self._session.worker_id} is busy")
        return ending

    async def close(self) -> None:
        await self.connection.close()


class SessionLink:
    """One session at the gateway, driving its lifecycle machine."""

    def __init__(
        self, gateway: Gateway, session: ActiveSession, tell: Tell, client: ClientSocket | None
    ) -> None:
        self.gateway = gateway
        self.session = session
        self.tell = tell
        self.client = client  # its socket, whose metrics observer sees what is relayed
        self.lifecycle = SessionLifecycle(session.session_id)
        self.ticket: Ticket | None = None

    @property
    def lease(self) -> Lease | None:
        return self.lifecycle.lease

    @property
    def ending(self) -> Ending | None:
        return self.lifecycle.ending

    def end(self, ending: Ending, detail: str = "") -> None:
        self.lifecycle.end(ending, detail)

    def submit(self) -> bool:
        """Queue for a slot; False when the queue refused (the session has ended)."""
        try:
            self.ticket = self.session.ticket = self.gateway.pool.submit(
                self.session.kind, self.session.session_id
            )
        except QueueFullError as exc:
            self.end(Ending.QUEUE_FULL, str(exc))
        except NoWorkersError as exc:
            self.end(Ending.NO_WORKERS, str(exc))
        return self.ticket is not None

    async def acquire(self, send_queue_message: SendJson, always_done: bool = False) -> Lease:
        """Wait for a slot, telling the client its place in the queue. An
        administrator's cancel raises ``LookupError`` (the session ends)."""
        assert self.ticket is not None, "submit() first"
        pool = self.gateway.pool
        lease = await pool.acquire(self.ticket, send_queue_message, always_done)
        self.lifecycle.leased(lease)
        self.session.lease = lease
        observer = session_observer(self.client) if self.client is not None else None
        if observer is not None:  # its units count for this worker on the admin page
            observer.worker_id = lease.worker_id
            observer.session_id = self.session.session_id  # ...and its context, per session
        if lease.request_type != self.session.kind:  # e.g. a prepare while queued changed it
            pool.retype(None, lease, self.session.kind)
        return lease

    @contextlib.asynccontextmanager
    async def worker(self, kind: RequestType | None = None) -> AsyncIterator[WorkerSocket]:
        """A socket to the leased worker for a session of ``kind`` (the
        session's own by default). Raises :class:`WorkerConnectError`."""
        lease = self.lifecycle.lease
        assert lease is not None, "acquire() first"
        settings = self.gateway.settings
        async with open_worker_session(settings, lease, kind or self.session.kind) as connection:
            self.session.worker = connection
            try:
                yield WorkerSocket(connection, self)
            finally:
                self.session.worker = None

    async def close(self) -> None:
        for action in self.lifecycle.close():
            if isinstance(action, ReleaseLease):
                self._release(action)
            elif isinstance(action, TellClient):
                with contextlib.suppress(WebSocketDisconnect, OSError, RuntimeError):
                    await self.tell(action.ending, action.detail)
            elif isinstance(action, RecoverRecording):
                # In a thread that finishes even if this task is cancelled meanwhile.
                data_dir = self.gateway.settings.data_dir
                await asyncio.to_thread(recover_abandoned, data_dir, action.recording_id)

    @property
    def worker_id(self) -> str:
        return self.lease.worker_id if self.lease is not None else "?"

    def worker_failed_detail(self) -> str:
        what = "request" if self.session.kind == "chat" else "session"
        return f"worker {self.worker_id} failed during the {what}"

    def _release(self, action: ReleaseLease) -> None:
        pool = self.gateway.pool
        worker = pool.scheduler.workers.get(action.lease.worker_id)
        if action.suspect_worker and worker is not None and worker.health is WorkerHealth.READY:
            # Out of rotation until its next status push, which a live worker
            # sends as the session ends: a dead worker's slot is not handed out.
            pool.set_worker_state(action.lease.worker_id, WorkerHealth.ERROR)
        pool.release(action.lease, ok=action.feeds_eta)


@contextlib.asynccontextmanager
async def gateway_session(
    gateway: Gateway, session: ActiveSession, tell: Tell, client: ClientSocket | None = None
) -> AsyncIterator[SessionLink]:
    """Register ``session`` (a ``ProtocolError`` if its id is in use) and
    drive it; whatever ends it, it is closed on the way out. The ways a
    session ends that are not bugs are caught here and become its ending:
    the client leaving, shutdown, an app switched off, an administrator's
    cancel, an unreachable worker."""
    gateway.sessions.add(session)
    link = SessionLink(gateway, session, tell, client)
    try:
        yield link
    except ServerShutdown:
        link.end(Ending.SHUTDOWN, SHUTDOWN_MESSAGE)
    except AppDisabled as exc:
        link.end(Ending.APP_DISABLED, exc.message)
    except LookupError:  # the ticket was cancelled
        link.end(Ending.CANCELLED, CANCELLED_MESSAGE)
    except QueueFullError as exc:  # a cluster's shared queue refused it after submit()
        link.end(Ending.QUEUE_FULL, str(exc))
    except NoWorkersError as exc:
        link.end(Ending.NO_WORKERS, str(exc))
    except WorkerConnectError as exc:
        link.end(Ending.WORKER_UNREACHABLE, str(exc))
    except (PeerGone, WebSocketDisconnect, OSError):
        link.end(Ending.CLIENT_LEFT)
    except asyncio.CancelledError:
        link.end(Ending.CLIENT_LEFT)
        raise
    except Exception as exc:  # a bug: logged once, here, and the client is told
        log.exception("session %s failed in the gateway", session.session_id)
        link.end(Ending.INTERNAL_ERROR, f"internal error: {exc}")
    finally:
        try:
            await link.close()
        finally:
            gateway.sessions.remove(session.session_id)

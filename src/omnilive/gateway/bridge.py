"""Gateway → worker session sockets: the client's messages up (an
``audio_chunk`` as a binary media frame, ``gateway/sessions.py``), the
worker's down, relayed without parsing them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from enum import Enum
from typing import TYPE_CHECKING

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosedError, InvalidHandshake, WebSocketException

from omnilive.config import Settings
from omnilive.gateway.links import CLOSE_TIMEOUT_S
from omnilive.gateway.observe import session_observer
from omnilive.gateway.scheduler import Lease
from omnilive.protocol.internal import (
    CLOSE_OK,
    CLOSE_SESSION_FAILED,
    CLOSE_WORKER_UNAVAILABLE,
    SESSION_PING_INTERVAL_S,
    Envelope,
    bearer,
    ws_url,
)

if TYPE_CHECKING:
    from omnilive.gateway.client_ws import ClientSocket

WORKER_OPEN_TIMEOUT_S = 10.0
# Headroom over the client limit: internal messages carry the client's payload
# plus the worker's own fields.
INTERNAL_SIZE_MARGIN = 1024 * 1024


class WorkerConnectError(Exception):
    """The leased worker could not be reached."""


class SessionEnd(Enum):
    OK = "ok"  # the worker finished the session normally
    FAILED = "failed"  # the worker ended it with an error the client was sent
    LOST = "lost"  # the worker went away mid-session (crash, kill)
    REFUSED = "refused"  # the worker was not ready or had no free slot


@asynccontextmanager
async def open_worker_session(
    settings: Settings, lease: Lease, kind: str
) -> AsyncIterator[ClientConnection]:
    url = ws_url(lease.worker_url, f"/internal/session/{kind}/{lease.session_id}")
    try:
        connection = await connect(
            url,
            additional_headers=bearer(settings.internal_token),
            max_size=settings.limits.max_message_bytes + INTERNAL_SIZE_MARGIN,
            open_timeout=WORKER_OPEN_TIMEOUT_S,
            # No pings: they would wait behind the client's events. A hung
            # worker's sockets are closed when its control channel is lost.
            ping_interval=SESSION_PING_INTERVAL_S,
            close_timeout=CLOSE_TIMEOUT_S,
            compression=None,  # payloads are media: not worth deflating on loopback
        )
    except (OSError, TimeoutError, InvalidHandshake) as exc:
        raise WorkerConnectError(f"worker {lease.worker_id} unreachable: {exc}") from None
    try:
        yield connection
    finally:
        await connection.close()


async def relay_to_client(
    worker: ClientConnection,
    send_text: Callable[[str], Awaitable[None]],
    observe: Callable[[Envelope], None] | None = None,
    client: ClientSocket | None = None,
) -> SessionEnd:
    """Forward every worker message until the worker closes: its envelope to
    ``observe`` and to the metrics of ``client`` (the client's socket, where
    there is one), the client's message, untouched, to ``send_text``."""
    metrics = session_observer(client) if client is not None else None
    try:
        async for frame in worker:
            envelope, payload = Envelope.split(frame if isinstance(frame, str) else frame.decode())
            if metrics is not None:
                metrics.relayed(envelope)
            if observe is not None:
                observe(envelope)
            await send_text(payload)
    except ConnectionClosedError:
        pass  # a close code other than 1000/1001; told apart below
    except WebSocketException:
        return SessionEnd.LOST
    code = worker.close_code
    if code == CLOSE_OK:
        return SessionEnd.OK
    if code == CLOSE_SESSION_FAILED:
        return SessionEnd.FAILED
    if code == CLOSE_WORKER_UNAVAILABLE:
        return SessionEnd.REFUSED
    return SessionEnd.LOST

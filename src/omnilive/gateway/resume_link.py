"""A connection that resumes a suspended session, and the channel a
resumable session talks to its client through (``docs/resume.md``).

The resuming connection's handler claims the token, hands its socket to the
session (which is served by the handler of the connection that opened it:
one owner for the session's whole life) and waits until the session lets
the socket go. A refused resume is an ``error`` (``resume_refused``) in the
route's protocol, then close 1008.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from starlette.websockets import WebSocket

from omnilive.gateway.auth import principal_of
from omnilive.gateway.client_channel import ClientChannel
from omnilive.gateway.metrics import GatewayMetrics
from omnilive.gateway.registry import ActiveSession
from omnilive.gateway.resume import kept_token, resume_request_of
from omnilive.gateway.state import Gateway
from omnilive.protocol.common import ErrorCode, ProtocolError
from omnilive.recording.files import session_dir, write_json_atomic

log = logging.getLogger(__name__)

CLOSE_POLICY_VIOLATION = 1008
CONNECTION_FILE = "connection.json"  # in a recording: where the client was away
# Tells a resuming client, in its route's protocol, that its resume was refused.
Refuse = Callable[[ProtocolError], Awaitable[None]]


@contextlib.asynccontextmanager
async def client_channel(
    gateway: Gateway, ws: WebSocket, session: ActiveSession, route: str, resumable: bool = True
) -> AsyncIterator[ClientChannel]:
    """The channel of a session on ``route``; its token stops working on exit."""
    limits = gateway.settings.limits
    grace = limits.resume_grace_s if resumable else 0.0
    channel = ClientChannel(
        ws, session, gateway.resumes, route, grace,
        limits.resume_buffer_events, limits.resume_buffer_bytes,
    )  # fmt: skip
    try:
        yield channel
    finally:
        await channel.aclose()
        if channel.gaps and session.recording_id is not None:
            data_dir = gateway.settings.data_dir
            await asyncio.to_thread(mark_gaps, data_dir, session.recording_id, channel.gaps)


async def serve_resume(gateway: Gateway, ws: WebSocket, route: str, refuse: Refuse) -> bool:
    """Serve ``ws`` (accepted) if it asks to resume a session: True when it
    did (resumed, then let go, or refused); False for a new session."""
    subprotocols = tuple(ws.scope.get("subprotocols") or ())
    try:
        query = {**ws.query_params, **kept_token(ws.scope)}
        request = resume_request_of(query, subprotocols)
        if request is None:
            return False
        channel = gateway.resumes.claim(request.token, principal_of(ws).key_id, route)
    except ProtocolError as exc:
        log.info("resume refused on %s: %s", route, exc.message)
        _count(ws, "refused")
        await refuse(exc)
        return True
    _count(ws, "resumed")
    arrival = channel.hand_over(ws, request.last_seq, request.token)
    await arrival.released.wait()
    if not arrival.attached:  # a newer resume came first, or the session ended
        why = "a newer connection resumed the session" if arrival.superseded else "it ended"
        await refuse(ProtocolError(ErrorCode.RESUME_REFUSED, f"not resumed: {why}"))
    return True


def asks_claimable_resume(
    gateway: Gateway, query: Mapping[str, str], owner: str | None, route: str
) -> bool:
    """Whether ``query`` asks to resume a session (True) or opens a new one;
    a resume that would be refused now raises its :class:`ProtocolError`
    (``resume_refused``). Nothing is taken: the session's own route claims
    the token when it runs."""
    request = resume_request_of(query, ())
    if request is None:
        return False
    gateway.resumes.claim(request.token, owner, route)
    return True


def mark_gaps(data_dir: Path, recording_id: str, gaps: list[dict[str, Any]]) -> None:
    """Write where the client was away into the session's recording, as
    ``connection.json`` beside its ``meta.json``: ``{gaps: [{dropped_at,
    resumed_at (null: never), input_gap_ms}]}`` (epoch seconds). Blocking."""
    directory = session_dir(data_dir, recording_id)
    if directory.is_dir():
        write_json_atomic(directory / CONNECTION_FILE, {"gaps": gaps})


def _count(ws: WebSocket, outcome: str) -> None:
    metrics = getattr(ws.app.state, "metrics", None)
    if isinstance(metrics, GatewayMetrics):
        metrics.resumes.inc(outcome)

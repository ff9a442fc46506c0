"""In a media process: the app a call's session runs on, a real WebSocket
to the gateway's own route for the call's protocol.

:class:`~omnilive.gateway.webrtc.call.Call` drives an ASGI app as it does in
the gateway; here that app opens a WebSocket on the gateway's internal Unix
socket (the same server, the same routes, auth and limits as the public
port; TLS where the gateway serves it), with the caller's one-time pass
(``gateway/call_passes.py``), and relays: the call's messages up, the
session's down. How the call ends is how the socket ends: a hang-up or a
closed peer closes it (the session ends), a failed connection drops it
without a Close frame (the session is held for a resume, as a dropped
WebSocket's is), and the gateway closing it closes the call.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from dataclasses import dataclass
from typing import Any

from websockets.asyncio.client import ClientConnection, unix_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from omnilive.gateway.call_passes import PASS_HEADER
from omnilive.gateway.webrtc.call import CLOSE_ABNORMAL, ASGIApp
from omnilive.gateway.webrtc.media_wire import OpenCall

log = logging.getLogger(__name__)
OPEN_TIMEOUT_S = 10.0  # the gateway's route accepts (or refuses) at once
CLOSE_POLICY = 1008  # as the auth middleware closes a WebSocket it refuses in-process
CLOSE_INTERNAL = 1011


@dataclass(frozen=True)
class GatewaySocket:
    """Where the gateway takes its calls' sessions: its internal Unix socket."""

    path: str
    tls: bool = False  # the gateway serves TLS on every socket it has

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        # A socket file in the gateway's private folder: whoever answers it
        # is the gateway (and the pass, not the channel, is the secret).
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context


def loopback_app(gateway: GatewaySocket, opening: OpenCall) -> ASGIApp:
    """The app of ``opening``'s call: its session on the gateway's route."""
    scheme = "wss" if gateway.tls else "ws"
    query = f"?{opening.query}" if opening.query else ""
    uri = f"{scheme}://localhost{opening.path}{query}"

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()  # websocket.connect: the call is answered
        try:
            ws = await unix_connect(
                gateway.path, uri, ssl=gateway.ssl_context(),
                additional_headers={PASS_HEADER: opening.credential},
                user_agent_header=opening.user_agent, compression=None, max_size=None,
                # No keepalive pings: the gateway reads a session's socket
                # only as fast as its session takes messages.
                ping_interval=None, open_timeout=OPEN_TIMEOUT_S, proxy=None,
            )  # fmt: skip
        except InvalidStatus as exc:
            await send({"type": "websocket.close", "code": CLOSE_POLICY,
                        "reason": _refusal_code(exc.response.body)})  # fmt: skip
            return
        except (OSError, InvalidHandshake, TimeoutError) as exc:
            log.warning("call %s: the gateway's socket is unreachable: %r", opening.call_id, exc)
            await send({"type": "websocket.close", "code": CLOSE_INTERNAL,
                        "reason": "gateway_unreachable"})  # fmt: skip
            return
        await send({"type": "websocket.accept"})
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(_up(ws, receive), name=f"call-{opening.call_id}-up")
                group.create_task(_down(ws, send), name=f"call-{opening.call_id}-down")
        finally:
            # Closed by now, unless this process is stopping (cancelled): then
            # the session hears a lost connection, which a new offer resumes.
            ws.transport.abort()

    return app


async def _up(ws: ClientConnection, receive: Any) -> None:
    """The call's messages to the session, until the call ends."""
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            if message.get("code") == CLOSE_ABNORMAL:
                ws.transport.abort()  # lost, not closed: the session may resume
            else:
                await ws.close()
            return
        try:
            await ws.send(message["text"])
        except ConnectionClosed:
            return  # the session ended; _down tells the call


async def _down(ws: ClientConnection, send: Any) -> None:
    """The session's messages to the call; the call closes with the socket."""
    try:
        async for text in ws:
            await send({"type": "websocket.send", "text": _text(text)})
    except ConnectionClosed:
        pass  # dropped: the call ends all the same
    await send({"type": "websocket.close", "code": ws.close_code or 1000})


def _text(message: str | bytes) -> str:
    return message if isinstance(message, str) else message.decode("utf-8", "replace")


def _refusal_code(body: bytes | bytearray | None) -> str:
    """The documented code of a refused upgrade's JSON body (``error_body``)."""
    try:
        code = json.loads(body or b"{}").get("code")
    except (ValueError, AttributeError):
        code = None
    return code if isinstance(code, str) else "refused"

"""Client WebSocket plumbing shared by every mode's route."""

from __future__ import annotations

import contextlib
import json
from typing import Any, Protocol

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from omnilive.gateway.observe import session_observer
from omnilive.protocol.common import ErrorCode, error_message

CLOSE_TRY_AGAIN = 1013  # RFC 6455 "try again later": queue full, no workers


class ClientSocket(Protocol):
    """What session code sends to and closes: a client's WebSocket, or a
    streaming session's :class:`~omnilive.gateway.client_channel.ClientChannel`,
    which stands for it across connections."""

    @property
    def scope(self) -> Any: ...

    @property
    def client_state(self) -> WebSocketState: ...

    async def send_text(self, data: str) -> None: ...

    async def close(self, code: int = 1000, reason: str | None = None) -> None: ...


async def until_disconnect(ws: WebSocket) -> None:
    """Return when the client leaves; frames it sends meanwhile are dropped."""
    while True:
        if (await ws.receive())["type"] == "websocket.disconnect":
            return


async def send_json(ws: ClientSocket, message: dict[str, Any]) -> None:
    """Send a message of the gateway's own (not a worker's), and tell the
    connection's metrics observer."""
    await ws.send_text(json.dumps(message))
    observer = session_observer(ws)
    if observer is not None:
        observer.sent(message)


async def fail(ws: ClientSocket, message: str, code: ErrorCode, close_code: int = 1000) -> None:
    """Send an ``error`` and close; a client already gone is not an error."""
    if ws.client_state is not WebSocketState.CONNECTED:
        return
    with contextlib.suppress(WebSocketDisconnect, OSError, RuntimeError):
        await send_json(ws, error_message(message, code))
        await ws.close(code=close_code, reason=close_reason(message))


def close_reason(message: str) -> str:
    """A close frame's reason holds at most 123 bytes of UTF-8; longer (or
    multi-byte text cut by characters) breaks the frame and drops the connection."""
    return message.encode()[:120].decode("utf-8", "ignore")


async def close_quietly(ws: ClientSocket, code: int = 1000, reason: str = "") -> None:
    if ws.client_state is WebSocketState.CONNECTED:
        with contextlib.suppress(WebSocketDisconnect, OSError, RuntimeError):
            await ws.close(code=code, reason=close_reason(reason) or None)

"""The gateway ↔ worker protocol on loopback.

A session is one WebSocket, ``/internal/session/{kind}/{session_id}``,
authenticated with the internal token. Messages on it are the client-facing
messages of that mode, so the gateway relays them without re-encoding media.
How a session ended is told by the close code. ``/internal/control`` pushes
the worker's status on every change (the readiness handshake).
"""

from __future__ import annotations

TOKEN_HEADER = "authorization"

CLOSE_OK = 1000
CLOSE_SESSION_FAILED = 4500  # the session ended with an error the client was told about
CLOSE_WORKER_UNAVAILABLE = 4503  # loading, failed, or no slot


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def ws_url(http_url: str, path: str) -> str:
    base = http_url.rstrip("/")
    if base.startswith("https://"):
        return "wss://" + base[len("https://") :] + path
    if base.startswith("http://"):
        return "ws://" + base[len("http://") :] + path
    return base + path

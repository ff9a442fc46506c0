"""The gateway ↔ worker protocol on loopback.

A session is one WebSocket, ``/internal/session/{kind}/{session_id}``,
authenticated with the internal token. Messages on it are the client-facing
messages of that mode, so the gateway relays them without re-encoding media.
How a session ended is told by the close code. ``/internal/control`` pushes
the worker's status on every change (the readiness handshake).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

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


# --- the start-up report ---------------------------------------------------------
# ``serve`` hands each worker the write end of a pipe (its number in this
# variable); the worker writes one line when its engine has loaded or failed
# to. The supervisor reads it to tell a worker that died while loading from one
# that died serving, and a configuration problem from a crash.
REPORT_FD_ENV = "OMNILIVE_REPORT_FD"


class LoadOutcome(StrEnum):
    READY = "ready"
    UNAVAILABLE = "unavailable"  # cannot load as configured: starting it again will not help
    FAILED = "failed"  # failed this time (a bug, a transient fault): worth a restart


@dataclass(frozen=True)
class LoadReport:
    outcome: LoadOutcome
    reason: str = ""

    def encode(self) -> bytes:
        reason = " ".join(self.reason.split())  # one line, whatever the exception said
        return f"{self.outcome.value} {reason}".rstrip().encode() + b"\n"

    @classmethod
    def decode(cls, line: bytes) -> LoadReport | None:
        """The report on ``line``, or None for anything else."""
        outcome, _, reason = line.decode("utf-8", "replace").strip().partition(" ")
        try:
            return cls(LoadOutcome(outcome), reason)
        except ValueError:
            return None

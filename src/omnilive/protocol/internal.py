"""The gateway ↔ worker protocol on loopback.

A session is one WebSocket, ``/internal/session/{kind}/{session_id}``,
authenticated with the internal token. The gateway sends the client's messages
of that mode (plus its own ``internal.*`` ones); the worker sends each message
for the client in an :class:`Envelope`: a header line with what the gateway
needs to know, then the message itself, which the gateway relays without
parsing or re-encoding it. How a session ended is told by the close code.
``/internal/control`` pushes the worker's status on every change (the
readiness handshake).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

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


# --- worker → gateway ----------------------------------------------------------------


@dataclass(frozen=True)
class Envelope:
    """What the gateway reads of a message the worker sends its client.

    On the wire: this as compact JSON on one line, a newline, then the message
    as the client gets it (JSON escapes every newline inside a string, so the
    first newline ends the header)."""

    type: str
    recording_id: str | None = None  # the recording the session writes (once announced)
    reason: str | None = None  # why a session ended (``session.closed``, ``timeout``)
    error: str | None = None  # an ``error`` message's text

    @classmethod
    def of(cls, message: dict[str, Any]) -> Envelope:
        kind = str(message.get("type", ""))
        recording = message.get("recording_session_id")
        error = message.get("error")
        return cls(
            type=kind,
            recording_id=recording if isinstance(recording, str) else None,
            reason=message.get("reason") if isinstance(message.get("reason"), str) else None,
            error=str(error.get("message") if isinstance(error, dict) else error)
            if kind == "error"
            else None,
        )

    @staticmethod
    def frame(message: dict[str, Any]) -> str:
        """A message for the client, enveloped."""
        header = {k: v for k, v in asdict(Envelope.of(message)).items() if v is not None}
        return json.dumps(header, separators=(",", ":")) + "\n" + json.dumps(message)

    @classmethod
    def split(cls, frame: str) -> tuple[Envelope, str]:
        """The header and the client's message of a worker frame."""
        header, _, payload = frame.partition("\n")
        return cls(**json.loads(header)), payload

"""The gateway ↔ worker protocol on loopback.

A session is one WebSocket, ``/internal/session/{kind}/{session_id}``,
authenticated with the internal token. The gateway sends the client's messages
of that mode (plus its own ``internal.*`` ones), each as the client sent it,
or, for an ``audio_chunk``, as a binary media frame (``media_frame.py``),
which a worker takes beside the text; the worker sends each message
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

from pydantic import BaseModel, Field

TOKEN_HEADER = "authorization"

CLOSE_OK = 1000
CLOSE_SESSION_FAILED = 4500  # the session ended with an error the client was told about
CLOSE_WORKER_UNAVAILABLE = 4503  # loading, failed, or no slot

# Session sockets carry no keepalive pings, either way. uvicorn reads a
# socket's next frame only once the app took the last one (and websockets'
# client, once its queue has room), so a ping sent behind a burst of client
# events is answered only when the session has caught up with them: it
# measures how far behind the session is, not whether its peer lives, and
# a busy session was ended as if its worker had died. A worker's liveness is
# its control channel's, which carries no data and whose reader never waits
# (``gateway/links.py``); a worker found gone there ends its sessions at once
# (``SessionRegistry.worker_gone``). A worker learns that its gateway went
# away when the socket closes; one whose gateway hangs ends its sessions by
# their own timeouts.
SESSION_PING_INTERVAL_S: float | None = None


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
# The listening socket ``serve`` bound for a worker it starts (its file
# descriptor, in this variable): the worker serves on it instead of binding.
LISTEN_FD_ENV = "OMNILIVE_LISTEN_FD"


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

    On the wire: this as compact JSON on one line (fields that are None left
    out), a newline, then the message as the client gets it (JSON escapes
    every newline inside a string, so the first newline ends the header).

    A duplex unit's facts are read wherever the message's dialect keeps them:
    a ``/ws/duplex`` ``result`` at its top level; the Realtime API's older
    dialect has only ``end_of_turn``, on its audio deltas; the newer one keeps
    them under ``metrics``, stamps every event in seconds, repeats a unit's
    facts on each of its deltas and ends a turn with a ``listen`` delta that
    names the response."""

    type: str
    recording_id: str | None = None  # the recording the session writes (once announced)
    reason: str | None = None  # why a session ended (``session.closed``, ``timeout``)
    error: str | None = None  # an ``error`` message's text
    code: str | None = None  # an ``error`` message's code
    sent_at_ms: float | None = None  # the worker's clock as it sent the message (epoch ms)
    wall_clock_ms: float | None = None  # a unit's time from its chunk arriving to being sent
    dropped_chunks: int | None = None  # input chunks dropped before the unit's
    unit_index: int | None = None  # the unit the facts above are of
    end_of_turn: bool | None = None  # the model's turn ended with this message
    # The session's context after the unit: its length and room (positions),
    # and the units its window let go so far (the admin page's fill per session).
    kv_cache_length: int | None = None
    context_capacity: int | None = None
    evicted_units: int | None = None

    @classmethod
    def of(cls, message: dict[str, Any]) -> Envelope:
        kind = str(message.get("type", ""))
        text: str | None = None
        code: Any = None
        if kind == "error":  # the Realtime API nests what the other protocols do not
            error = message.get("error")
            if isinstance(error, dict):
                text = str(error.get("message"))
                code = message.get("code") or error.get("code")
            else:
                text, code = str(error), message.get("code")
        return cls(
            type=kind,
            recording_id=_text(message.get("recording_session_id")),
            reason=_text(message.get("reason")),
            error=text,
            code=str(code) if code else None,
            **_unit_facts(kind, message),
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


def _unit_facts(kind: str, message: dict[str, Any]) -> dict[str, Any]:
    """The unit fields of :class:`Envelope`, as each dialect writes them."""
    if kind == "result":  # /ws/duplex
        sent = _number(message.get("server_send_ts"))  # already in ms
        facts, unit = message, message.get("unit_index")
    else:  # the Realtime API
        seconds = _number(message.get("server_send_ts"))
        sent = round(seconds * 1000, 1) if seconds is not None else None
        metrics = message.get("metrics")
        facts, unit = metrics if isinstance(metrics, dict) else {}, message.get("chunk_index")
    end = message.get("end_of_turn")
    if kind == "response.output.delta" and message.get("kind") == "listen":
        end = message.get("response_id") is not None
    return {
        "sent_at_ms": sent,
        "wall_clock_ms": _number(facts.get("wall_clock_ms")),
        "dropped_chunks": _count(facts.get("dropped_chunks")),
        "unit_index": _count(unit),
        "end_of_turn": end if isinstance(end, bool) else None,
        "kv_cache_length": _count(facts.get("kv_cache_length")),
        "context_capacity": _count(facts.get("context_capacity")),
        "evicted_units": _count(facts.get("evicted_units")),
    }


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# --- worker state ---------------------------------------------------------------------


class LoadProgress(BaseModel):
    stage: str = ""
    fraction: float = 0.0


class SessionState(BaseModel):
    session_id: str
    kind: str
    state: str


class WorkerStatus(BaseModel):
    """What a worker pushes on ``/internal/control`` at every change (and
    answers to ``GET /health``). Unknown fields are ignored: a newer worker
    may say more."""

    status: str = "healthy"
    worker_id: str
    worker_status: str  # loading | idle | busy | duplex_active | ... | error
    engine: str | None = None
    model_loaded: bool = False
    load_progress: LoadProgress = Field(default_factory=LoadProgress)
    error: str | None = None
    gpu_id: int | None = None
    pid: int | None = None
    slots: int = 1
    capabilities: dict[str, Any] = Field(default_factory=dict)
    current_session_id: str | None = None
    sessions: list[SessionState] = Field(default_factory=list)
    total_requests: int = 0
    avg_inference_time_ms: float = 0.0
    kv_cache_length: int = 0

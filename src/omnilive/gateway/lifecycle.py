"""A session's life at the gateway, without I/O: QUEUED → ACTIVE → CLOSING → CLOSED.

Every route drives one of these (through ``gateway/session_link.py``):
chat over WebSocket and HTTP, half-duplex, duplex and both Realtime
dialects. It is told what happens — the session got its lease, and how it
ended (its worker finished it or failed, the client left, an administrator
cancelled it, its app was switched off, the server is shutting down) — and
answers, once, with what closing it takes: give the slot back (feeding the
ETA model or not), tell the client why in its protocol, close a recording
whose writer died with its worker. This is the one place that decides how a
session ended and which sessions teach the ETA model how long a slot is held.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from omnilive.gateway.scheduler import Lease
from omnilive.ids import is_safe_id
from omnilive.transitions import IllegalTransition


class Stage(StrEnum):
    QUEUED = "queued"  # waiting for a slot (a refused submit ends here too)
    ACTIVE = "active"  # holds a lease
    CLOSING = "closing"  # its ending is known; the slot is being given back
    CLOSED = "closed"


class Ending(StrEnum):
    """How a session ended. The first ending reported wins."""

    DONE = "done"  # the worker finished it, or the session's own protocol closed it
    FAILED = "failed"  # the worker ended it with an error its client was sent
    CLIENT_LEFT = "client_left"
    QUEUE_FULL = "queue_full"  # refused at submit
    NO_WORKERS = "no_workers"  # refused at submit: nothing could ever serve it
    CANCELLED = "cancelled"  # an administrator removed it from the queue
    APP_DISABLED = "app_disabled"  # an operator switched its app off
    SHUTDOWN = "shutdown"  # the gateway is shutting down
    WORKER_BUSY = "worker_busy"  # the worker refused the session (not ready, no slot)
    WORKER_UNREACHABLE = "worker_unreachable"
    WORKER_LOST = "worker_lost"  # the worker went away mid-session
    INTERNAL_ERROR = "internal_error"  # a bug in the gateway (logged where it is caught)


# Endings the client has not heard of from its worker: its route tells it.
TOLD_BY_GATEWAY = frozenset(Ending) - {Ending.DONE, Ending.FAILED, Ending.CLIENT_LEFT}
# A slot held until one of these ends tells the ETA model how long a session
# of its kind holds a slot. The others say nothing about that: the worker
# failed or refused, or the server cut the session short.
_FEEDS_ETA = frozenset({Ending.DONE, Ending.FAILED, Ending.CLIENT_LEFT})
# Endings only a session without a lease can have.
_QUEUE_ENDINGS = frozenset({Ending.QUEUE_FULL, Ending.NO_WORKERS, Ending.CANCELLED})


@dataclass(frozen=True)
class ReleaseLease:
    lease: Lease
    feeds_eta: bool
    # The worker is held out of rotation until it shows it is alive, so that
    # the slot of a dead worker is not handed to the next client meanwhile.
    suspect_worker: bool


@dataclass(frozen=True)
class TellClient:
    ending: Ending
    detail: str


@dataclass(frozen=True)
class RecoverRecording:
    """Close the recording whose writer died with the worker (``abnormal``)."""

    recording_id: str


Action = ReleaseLease | TellClient | RecoverRecording


class SessionLifecycle:
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.stage = Stage.QUEUED
        self.lease: Lease | None = None
        self.ending: Ending | None = None
        self.detail = ""
        # The recording the worker writes, once it says (in an envelope); a
        # chat's id is its recording id from the start.
        self.recording_id: str | None = None
        self._served = False  # it held its lease while open

    def leased(self, lease: Lease) -> None:
        """The session got its slot. One that ended meanwhile (its lease and
        its end crossed) keeps it only to give it back, unused."""
        if self.lease is not None or self.stage is Stage.CLOSED:
            raise IllegalTransition(f"leased while {self.stage}")
        self.lease = lease
        if self.stage is Stage.QUEUED:
            self.stage = Stage.ACTIVE
            self._served = True

    def note_recording(self, recording_id: str | None) -> None:
        if self.recording_id is None and recording_id is not None and is_safe_id(recording_id):
            self.recording_id = recording_id

    def end(self, ending: Ending, detail: str = "") -> None:
        """Report how the session ended; a later report is about the same end."""
        if self.stage is Stage.CLOSED:
            raise IllegalTransition(f"{ending} after the session closed")
        if ending in _QUEUE_ENDINGS and self.lease is not None:
            raise IllegalTransition(f"{ending} while holding a lease")
        if self.ending is None:
            self.ending, self.detail = ending, detail
            self.stage = Stage.CLOSING

    def close(self) -> list[Action]:
        """What closing the session takes, in order. A session that never
        reported its ending was left by its client."""
        if self.stage is Stage.CLOSED:
            raise IllegalTransition("closed twice")
        if self.ending is None:
            self.end(Ending.CLIENT_LEFT)
        ending = self.ending
        assert ending is not None
        self.stage = Stage.CLOSED
        actions: list[Action] = []
        if self.lease is not None:
            lost = ending is Ending.WORKER_LOST
            feeds_eta = self._served and ending in _FEEDS_ETA
            actions.append(ReleaseLease(self.lease, feeds_eta, suspect_worker=lost))
        if ending in TOLD_BY_GATEWAY:
            actions.append(TellClient(ending, self.detail))
        if ending is Ending.WORKER_LOST and self.recording_id is not None:
            actions.append(RecoverRecording(self.recording_id))
        return actions

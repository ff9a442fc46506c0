"""The Realtime API's session state machine, without I/O.

QUEUED → CONNECTED → ACTIVE → CLOSED. Feed it client frames, queue messages
and the types of worker events; it answers with actions: an event for the
client, a message for the worker (the Realtime API is served by translating
to the duplex protocol), or closing the connection.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from omnilive.protocol.common import has_lone_surrogates
from omnilive.protocol.realtime import (
    CLOSE_UNSUPPORTED_DATA,
    QUEUE_EVENT_NAMES,
    Append,
    CloseReason,
    RealtimeError,
    RealtimeErrorCode,
    SessionClose,
    SessionUpdate,
    closed_event,
    error_event,
    parse_event,
)


class RealtimeState(StrEnum):
    QUEUED = "queued"
    CONNECTED = "connected"
    ACTIVE = "active"
    CLOSED = "closed"


@dataclass(frozen=True)
class ToClient:
    event: dict[str, Any]


@dataclass(frozen=True)
class ToWorker:
    message: dict[str, Any]


@dataclass(frozen=True)
class Close:
    """End the session: close the client socket with ``code``."""

    code: int = 1000


Action = ToClient | ToWorker | Close


# Session ends in the duplex dialect, as a worker announces them before it
# has been told that the session speaks the Realtime API.
_DUPLEX_ENDS = {"timeout": CloseReason.TIMEOUT, "stopped": CloseReason.STOPPED}


class IllegalTransition(Exception):
    pass


class RealtimeMachine:
    def __init__(
        self, mode: Literal["video", "audio"], session_id: str, context_limit: int
    ) -> None:
        self.mode = mode
        self.session_id = session_id
        self.context_limit = context_limit
        self.state = RealtimeState.QUEUED
        self._update_pending = False  # a session.update is with the worker

    @property
    def task_type(self) -> Literal["omni_duplex", "audio_duplex"]:
        return "omni_duplex" if self.mode == "video" else "audio_duplex"

    def _move(self, expected: RealtimeState, target: RealtimeState) -> None:
        if self.state is not expected:
            raise IllegalTransition(f"{self.state} → {target} (expected {expected})")
        self.state = target

    # --- the queue ---------------------------------------------------------------

    def queue_event(self, message: dict[str, Any]) -> ToClient:
        """A pool message (queued / queue_update / queue_done) as a realtime event."""
        if message["type"] == "queue_done":
            self._move(RealtimeState.QUEUED, RealtimeState.CONNECTED)
        return ToClient({**message, "type": QUEUE_EVENT_NAMES[message["type"]]})

    # --- the client -----------------------------------------------------------------

    def client_frame(self, raw: str | bytes) -> list[Action]:
        if self.state is RealtimeState.CLOSED:
            return []
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            self.state = RealtimeState.CLOSED
            return [Close(CLOSE_UNSUPPORTED_DATA)]
        if not isinstance(data, dict):
            return [self._error(RealtimeErrorCode.INVALID_PAYLOAD, "an event is a JSON object")]
        if has_lone_surrogates(raw, data):
            return [self._error(RealtimeErrorCode.INVALID_PAYLOAD, "unpaired UTF-16 surrogate")]
        try:
            event = parse_event(data)
        except RealtimeError as exc:
            return [self._error(exc.code, exc.message)]
        if isinstance(event, SessionClose):
            return self._close_requested()
        if self.state is RealtimeState.QUEUED:
            return [self._error(RealtimeErrorCode.NOT_READY, "wait for session.queue_done")]
        if isinstance(event, SessionUpdate):
            return self._update(event)
        return self._append(event)

    def _close_requested(self) -> list[Action]:
        """Closing is always allowed; once a worker holds a configured session,
        it confirms (so its recording is finalized first). Before the first
        session.update the worker still speaks the duplex dialect and has
        nothing to finalize: the session closes here."""
        configured = self.state is RealtimeState.ACTIVE or self._update_pending
        if not configured:
            self.state = RealtimeState.CLOSED
            return [ToClient(closed_event(CloseReason.STOPPED)), Close()]
        return [ToWorker({"type": "stop"})]

    def _update(self, event: SessionUpdate) -> list[Action]:
        if self.state is RealtimeState.ACTIVE or self._update_pending:
            return [self._error(RealtimeErrorCode.INVALID_PAYLOAD, "session is already configured")]
        self._update_pending = True
        config = event.session
        return [
            ToWorker(
                {
                    "type": "prepare",
                    "system_prompt": config.instructions,
                    "max_slice_nums": config.max_slice_nums,
                    "ref_audio_base64": config.ref_audio,
                    # The TTS voice falls back to ref_audio, unless a stored one is named.
                    "tts_ref_audio_base64": config.tts_ref_audio
                    or (None if config.tts_ref_audio_id else config.ref_audio),
                    "ref_audio_id": config.ref_audio_id,
                    "tts_ref_audio_id": config.tts_ref_audio_id,
                    "ref_audio_format": "wav",
                    "deferred_finalize": True,
                    "mode": self.task_type,
                    "dialect": "realtime",
                    "context_limit": self.context_limit,
                    "recording": config.recording,
                }
            )
        ]

    def _append(self, event: Append) -> list[Action]:
        if self.state is not RealtimeState.ACTIVE:
            return [self._error(RealtimeErrorCode.NOT_READY, "wait for session.created")]
        message: dict[str, Any] = {
            "type": "audio_chunk",
            "audio_base64": event.audio,
            "force_listen": event.force_listen,
        }
        if self.mode == "video" and event.video_frames:
            message["frame_base64_list"] = event.video_frames
        if event.max_slice_nums is not None:
            message["max_slice_nums"] = event.max_slice_nums
        return [ToWorker(message)]

    # --- the worker --------------------------------------------------------------------

    def forwards(self, event_type: str) -> bool:
        """Whether a worker event goes to the client as it is. Until the first
        session.update is applied the worker speaks the duplex dialect; the
        ends it may announce then (``timeout``, ``stopped``) are translated."""
        return not (self.state is RealtimeState.CONNECTED and event_type in _DUPLEX_ENDS)

    def worker_event(self, event_type: str) -> list[Action]:
        """Observe the type of an event the worker sent the client."""
        if self.state is RealtimeState.CONNECTED and event_type in _DUPLEX_ENDS:
            return self.end(_DUPLEX_ENDS[event_type])
        if event_type == "session.created":
            self._move(RealtimeState.CONNECTED, RealtimeState.ACTIVE)
            self._update_pending = False
        elif event_type == "error" and self.state is RealtimeState.CONNECTED:
            self._update_pending = False  # the update failed; the client may send another
        elif event_type == "session.closed":
            self.state = RealtimeState.CLOSED
            return [Close()]
        return []

    def end(self, reason: CloseReason) -> list[Action]:
        """A server-side end: timeout, server shutdown or an unrecoverable error."""
        if self.state is RealtimeState.CLOSED:
            return []
        self.state = RealtimeState.CLOSED
        return [ToClient(closed_event(reason)), Close()]

    def _error(self, code: RealtimeErrorCode, message: str) -> ToClient:
        return ToClient(error_event(code, message))

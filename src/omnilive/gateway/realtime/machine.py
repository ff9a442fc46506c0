"""The Realtime API's session state machine, without I/O.

QUEUED → CONNECTED → ACTIVE → CLOSED. Feed it client frames, queue messages
and the types of worker events; it answers with actions: an event for the
client, a message for the worker (the Realtime API is served by translating
to the duplex protocol), or closing the connection. The newer dialect's
machine (``v2_machine.py``) has the same shape and takes the same
actions.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from omnilive.protocol.common import ErrorCode, ProtocolError, load_json
from omnilive.protocol.internal import Envelope
from omnilive.protocol.realtime import (
    CLOSE_UNSUPPORTED_DATA,
    DEFAULT_INSTRUCTIONS,
    QUEUE_EVENT_NAMES,
    Append,
    CloseReason,
    RealtimeErrorCode,
    ResponseCancel,
    SessionClose,
    SessionUpdate,
    cancelled_event,
    closed_event,
    error_event,
    parse_event,
    refusal_event,
)
from omnilive.transitions import IllegalTransition


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
    """End the session: close the client socket with ``code`` (and ``reason``,
    where the dialect names one)."""

    code: int = 1000
    reason: str = ""


Action = ToClient | ToWorker | Close


# Session ends in the duplex dialect, as a worker announces them before it
# has been told that the session speaks the Realtime API.
_DUPLEX_ENDS = {"timeout": CloseReason.TIMEOUT, "stopped": CloseReason.STOPPED}


class DuplexRealtimeMachine:
    """What the machines of both dialects' video and audio sessions share: the
    queue, the worker's arrival, and decoding a client frame. A configuring
    event (``session.update`` / ``session.init``) that comes before the
    session has its worker is kept, and applied once it has."""

    dialect: str

    def __init__(
        self,
        mode: Literal["video", "audio"],
        session_id: str,
        context_limit: int,
        max_bytes: int | None = None,
    ) -> None:
        self.mode = mode
        self.session_id = session_id
        self.context_limit = context_limit
        self.max_bytes = max_bytes  # the largest client frame (limits.max_message_bytes)
        self.state = RealtimeState.QUEUED
        self.worker_attached = False
        self._configuring = False  # the first configuration is with the worker
        self._waiting: Any = None  # a configuring event to apply when possible

    @property
    def task_type(self) -> Literal["omni_duplex", "audio_duplex"]:
        return "omni_duplex" if self.mode == "video" else "audio_duplex"

    def _move(self, expected: RealtimeState, target: RealtimeState) -> None:
        if self.state is not expected:
            raise IllegalTransition(f"{self.state} → {target} (expected {expected})")
        self.state = target

    def queue_event(self, message: dict[str, Any]) -> ToClient:
        """A pool message (queued / queue_update / queue_done) as a realtime event."""
        if message["type"] == "queue_done":
            self._move(RealtimeState.QUEUED, RealtimeState.CONNECTED)
        return ToClient({**message, "type": QUEUE_EVENT_NAMES[message["type"]]})

    def attach_worker(self) -> list[Action]:
        """The worker's session socket is open: a kept configuration goes to it now."""
        self.worker_attached = True
        return self._apply_waiting()

    def _apply_waiting(self) -> list[Action]:
        waiting, self._waiting = self._waiting, None
        return self._configure(waiting) if waiting is not None else []

    def client_frame(self, raw: str | bytes) -> list[Action]:
        if self.state is RealtimeState.CLOSED:
            return []
        try:
            data = load_json(raw, self.max_bytes)
        except ProtocolError as exc:
            if exc.code is ErrorCode.PAYLOAD_TOO_LARGE:
                return self._too_large(exc.message)
            return self._not_json()
        if not isinstance(data, dict):
            return self._malformed("an event is a JSON object")
        return self.client_event(data)

    def options_message(self) -> dict[str, Any]:
        """The gateway's own message before the first ``prepare``: the worker
        serves this session in the Realtime API's dialect."""
        return {"type": "internal.realtime", "dialect": self.dialect,
                "context_limit": self.context_limit}  # fmt: skip

    def client_event(self, data: dict[str, Any]) -> list[Action]:
        raise NotImplementedError

    def _configure(self, event: Any) -> list[Action]:
        raise NotImplementedError

    def _not_json(self) -> list[Action]:
        raise NotImplementedError

    def _too_large(self, message: str) -> list[Action]:
        raise NotImplementedError

    def _malformed(self, message: str) -> list[Action]:
        raise NotImplementedError


class RealtimeMachine(DuplexRealtimeMachine):
    """The older dialect (``session.update``, ``input_audio_buffer.append``).

    A ``session.update`` that comes before the session has a worker is kept
    and applied once it has one (the reference's page sends it 100 ms after
    connecting); one that comes while the first is being applied waits for
    it; one that comes later updates the session (``session.updated``)."""

    dialect = "realtime"

    def __init__(
        self,
        mode: Literal["video", "audio"],
        session_id: str,
        context_limit: int,
        max_bytes: int | None = None,
    ) -> None:
        super().__init__(mode, session_id, context_limit, max_bytes)
        self._cancel_pending = False  # the next append forces a listen

    def _not_json(self) -> list[Action]:
        self.state = RealtimeState.CLOSED
        return [Close(CLOSE_UNSUPPORTED_DATA)]

    def _malformed(self, message: str) -> list[Action]:
        return [self._error(RealtimeErrorCode.INVALID_PAYLOAD, message)]

    def _too_large(self, message: str) -> list[Action]:
        return [self._error(RealtimeErrorCode.PAYLOAD_TOO_LARGE, message)]

    def client_event(self, data: dict[str, Any]) -> list[Action]:
        """One decoded client event."""
        try:
            event = parse_event(data)
        except ProtocolError as exc:
            return [ToClient(refusal_event(exc))]
        if isinstance(event, SessionClose):
            return self._close_requested()
        if isinstance(event, SessionUpdate):
            return self._configure(event)
        if self.state is RealtimeState.QUEUED:
            return [self._error(RealtimeErrorCode.NOT_READY, "wait for session.queue_done")]
        if isinstance(event, ResponseCancel):
            return self._cancel()
        return self._append(event)

    def _close_requested(self) -> list[Action]:
        """Closing is always allowed; once a worker holds a configured session,
        it confirms (so its recording is finalized first). Before the first
        session.update the worker still speaks the duplex dialect and has
        nothing to finalize: the session closes here."""
        configured = self.state is RealtimeState.ACTIVE or self._configuring
        if not configured:
            self.state = RealtimeState.CLOSED
            return [ToClient(closed_event(CloseReason.STOPPED)), Close()]
        return [ToWorker({"type": "stop"})]

    def _configure(self, event: SessionUpdate) -> list[Action]:
        if self.state is RealtimeState.ACTIVE:
            return [ToWorker(self._update_message(event))]
        if self.state is not RealtimeState.CONNECTED or not self.worker_attached:
            self._waiting = event  # the latest one wins
            return []
        if self._configuring:
            self._waiting = event
            return []
        self._configuring = True
        return [ToWorker(self.options_message()), ToWorker(self._prepare_message(event))]

    def _prepare_message(self, event: SessionUpdate) -> dict[str, Any]:
        config = event.session
        return {
            "type": "prepare",
            "system_prompt": config.instructions or DEFAULT_INSTRUCTIONS,
            "max_slice_nums": config.max_slice_nums,
            "ref_audio_base64": config.ref_audio,
            # The TTS voice falls back to ref_audio, unless a stored one is named.
            "tts_ref_audio_base64": config.tts_ref_audio
            or (None if config.tts_ref_audio_id else config.ref_audio),
            "ref_audio_id": config.ref_audio_id,
            "tts_ref_audio_id": config.tts_ref_audio_id,
            "deferred_finalize": True,
            "mode": self.task_type,
            "recording": config.recording,
            "context_window": (
                config.context_window.model_dump(exclude_none=True)
                if config.context_window
                else None
            ),
        }

    @staticmethod
    def _update_message(event: SessionUpdate) -> dict[str, Any]:
        """A later update: what it names changes, from the next turn on."""
        config = event.session
        return {
            "type": "update",
            "system_prompt": config.instructions,
            "ref_audio_base64": config.ref_audio,
            "tts_ref_audio_base64": config.tts_ref_audio,
            "ref_audio_id": config.ref_audio_id,
            "tts_ref_audio_id": config.tts_ref_audio_id,
        }

    def _cancel(self) -> list[Action]:
        if self.state is not RealtimeState.ACTIVE:
            return [self._error(RealtimeErrorCode.NOT_READY, "no response to cancel yet")]
        self._cancel_pending = True
        return [ToClient(cancelled_event())]

    def _append(self, event: Append) -> list[Action]:
        if self.state is not RealtimeState.ACTIVE:
            return [self._error(RealtimeErrorCode.NOT_READY, "wait for session.created")]
        message: dict[str, Any] = {
            "type": "audio_chunk",
            "audio_base64": event.audio,
            "force_listen": event.force_listen or self._cancel_pending,
        }
        self._cancel_pending = False
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

    def worker_event(self, envelope: Envelope) -> list[Action]:
        """Observe an event the worker sent the client (its envelope)."""
        event_type = envelope.type
        if self.state is RealtimeState.CONNECTED and event_type in _DUPLEX_ENDS:
            return self.end(_DUPLEX_ENDS[event_type])
        if event_type == "session.created":
            self._move(RealtimeState.CONNECTED, RealtimeState.ACTIVE)
            self._configuring = False
            return self._apply_waiting()
        if event_type == "error" and self.state is RealtimeState.CONNECTED:
            self._configuring = False  # the update failed; the client may send another
            return self._apply_waiting()
        if event_type == "session.closed":
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

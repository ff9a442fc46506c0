"""The Realtime API's newer dialect, video and audio sessions, without I/O.

QUEUED → CONNECTED → ACTIVE → CLOSED, as in ``machine.py`` and with
its actions, under the newer dialect's rules: ``session.init`` once (kept if
it comes before the session has a worker), ``input.append`` only once the
session is created, ``session.close`` at any time; anything else, and any
malformed event, ends the session (``session.closed{backend_error}`` with a
diagnostic, close 1011). Worker events are already in this dialect (the
worker's presenter), except the ends it announces before it was told the
dialect, which are translated here.
"""

from __future__ import annotations

from typing import Any

from omnilive.gateway.realtime.machine import (
    Action,
    Close,
    DuplexRealtimeMachine,
    RealtimeState,
    ToClient,
    ToWorker,
)
from omnilive.protocol.common import ProtocolError
from omnilive.protocol.internal import Envelope
from omnilive.protocol.realtime import DEFAULT_INSTRUCTIONS, CloseReason
from omnilive.protocol.realtime_v2 import (
    CLOSE_FATAL,
    InputAppend,
    SessionClose,
    SessionInit,
    V2Reason,
    closed_event,
    parse_duplex_input,
    parse_event,
    violation,
)

# The worker's ends before it speaks this dialect, and the gateway's own.
_DUPLEX_ENDS = {"timeout": V2Reason.TIMEOUT, "stopped": V2Reason.CLIENT_CLOSED}
_SERVER_ENDS = {
    CloseReason.TIMEOUT: V2Reason.TIMEOUT,
    CloseReason.SERVER_SHUTDOWN: V2Reason.SERVER_SHUTDOWN,
    CloseReason.STOPPED: V2Reason.CLIENT_CLOSED,
}


class RealtimeV2Machine(DuplexRealtimeMachine):
    dialect = "realtime_v2"

    @classmethod
    def taking_over(cls, older: DuplexRealtimeMachine) -> RealtimeV2Machine:
        """This dialect's machine for a session whose first events did not
        tell the dialect (queue events are the same in both)."""
        machine = cls(older.mode, older.session_id, older.context_limit, older.max_bytes)
        machine.state = older.state
        machine.worker_attached = older.worker_attached
        return machine

    def _not_json(self) -> list[Action]:
        return self._fatal("an event is a JSON object")

    def _malformed(self, message: str) -> list[Action]:
        return self._fatal(message)

    def _too_large(self, message: str) -> list[Action]:
        return self._fatal(message)  # this dialect has no error events

    def client_event(self, data: dict[str, Any]) -> list[Action]:
        try:
            event = parse_event(data)
            if isinstance(event, SessionClose):
                return self._close_requested(event.reason)
            if isinstance(event, SessionInit):
                return self._configure(event)
            return self._append(event)
        except ProtocolError as exc:
            return self._fatal(exc.message)

    def _close_requested(self, reason: str | None) -> list[Action]:
        """Always allowed; a configured session is closed by its worker, which
        finalizes its recording first."""
        if self.state is RealtimeState.ACTIVE or self._configuring:
            return [ToWorker({"type": "stop", "reason": (reason or "")[:64] or None})]
        return self._closed(reason or V2Reason.CLIENT_CLOSED)

    def _configure(self, event: SessionInit) -> list[Action]:
        if self.state is RealtimeState.ACTIVE or self._configuring:
            raise violation("session.init is sent once")
        if self.state is not RealtimeState.CONNECTED or not self.worker_attached:
            if self._waiting is not None:
                raise violation("session.init is sent once")
            self._waiting = event
            return []
        self._configuring = True
        payload = event.payload
        return [
            ToWorker(self.options_message()),
            ToWorker(
                {
                    "type": "prepare",
                    "system_prompt": payload.system_prompt or DEFAULT_INSTRUCTIONS,
                    "config": payload.config,
                    "max_slice_nums": payload.max_slice_nums,
                    "ref_audio_base64": payload.llm_voice,
                    "tts_ref_audio_base64": payload.tts_voice,
                    "deferred_finalize": True,
                    "mode": self.task_type,
                    "recording": payload.recording,
                }
            ),
        ]

    def _append(self, event: InputAppend) -> list[Action]:
        if self.state is not RealtimeState.ACTIVE:
            raise violation("input.append before session.created")
        given = parse_duplex_input(event)
        message: dict[str, Any] = {
            "type": "audio_chunk",
            "audio_base64": given.audio,
            "force_listen": given.listen_forced,
            "input_id": given.input_id,
        }
        if self.mode == "video" and given.video_frames:
            message["frame_base64_list"] = given.video_frames
        if given.slice_nums is not None:
            message["max_slice_nums"] = given.slice_nums
        return [ToWorker(message)]

    # --- the worker --------------------------------------------------------------------

    def forwards(self, event_type: str) -> bool:
        """The worker's own events are in this dialect, but for the ends it
        announces before it knows the dialect, and errors (this dialect has
        none: they end the session, see :meth:`worker_event`)."""
        if event_type == "error":
            return False
        return not (self.state is RealtimeState.CONNECTED and event_type in _DUPLEX_ENDS)

    def worker_event(self, envelope: Envelope) -> list[Action]:
        event_type = envelope.type
        if self.state is RealtimeState.CONNECTED and event_type in _DUPLEX_ENDS:
            return self._closed(_DUPLEX_ENDS[event_type])
        if event_type == "error":  # the worker's own failure, in the duplex dialect
            return self._fatal(envelope.error or "the worker failed")
        if event_type == "session.created":
            self._move(RealtimeState.CONNECTED, RealtimeState.ACTIVE)
            self._configuring = False
        elif event_type == "session.closed":
            self.state = RealtimeState.CLOSED
            if envelope.reason == V2Reason.BACKEND_ERROR:
                return [Close(CLOSE_FATAL, V2Reason.BACKEND_ERROR)]
            return [Close()]
        return []

    def end(self, reason: CloseReason) -> list[Action]:
        """A server-side end: the session's time is up, shutdown, a lost worker."""
        if self.state is RealtimeState.CLOSED:
            return []
        if reason in _SERVER_ENDS:
            return self._closed(_SERVER_ENDS[reason])
        return self._fatal(f"the session ended: {reason}")

    def _closed(self, reason: str) -> list[Action]:
        self.state = RealtimeState.CLOSED
        return [ToClient(closed_event(self.session_id, reason)), Close()]

    def _fatal(self, message: str) -> list[Action]:
        self.state = RealtimeState.CLOSED
        event = closed_event(self.session_id, V2Reason.BACKEND_ERROR, message)
        # The close says it too, as the reference's does (1011 backend_error):
        # a client that reads only the close code and reason learns why.
        return [ToClient(event), Close(CLOSE_FATAL, V2Reason.BACKEND_ERROR)]

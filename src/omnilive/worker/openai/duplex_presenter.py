"""The full-duplex unit loop as OpenAI Realtime (GA) responses: omnilive's
mapping, without I/O.

The model decides every second whether to listen or speak. The first
speaking unit after listening opens a response (``response.created``, an
assistant message item and its content part); each speaking unit's text
and audio are that response's deltas; the unit that ends the turn, or the
first listening unit after speech, closes it (``response.done``,
``completed``). A response the user talked over (the server VAD heard
speech while it ran) or the client cancelled ends ``cancelled`` with
``turn_detected`` / ``client_cancelled``, and the next unit is a forced
listen. The duplex loop's own messages (ready, updated, errors, its ends)
become GA events, or omnilive's ``omnilive.*`` events for a client that
asked for them (``omnilive_extensions``); for any other, nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from omnilive.engines.messages import DuplexUnit
from omnilive.protocol.common import ErrorCode
from omnilive.protocol.openai_realtime import SessionConfig, error_event, server_event
from omnilive.worker.chunk_buffer import PendingChunk
from omnilive.worker.openai.items import Conversation
from omnilive.worker.openai.presenter import ResponsePresenter, usage
from omnilive.worker.presenters import UnitTiming

Event = dict[str, Any]
_CODES = {
    ErrorCode.INFERENCE_ERROR: "inference_error",
    ErrorCode.UNSUPPORTED: "unsupported",
    ErrorCode.PAYLOAD_TOO_LARGE: "payload_too_large",
    ErrorCode.NOT_READY: "unsupported",
}
_ENDS = {
    "timeout": "session_expired",
    "idle": "session_expired",
    "context_full": "context_full",
    "pause": "session_expired",
}


class OpenAIDuplexPresenter:
    def __init__(
        self,
        config: Callable[[], SessionConfig],
        session: Callable[[], Event],
        conversation: Conversation,
    ) -> None:
        self._config = config  # the session's configuration as it stands
        self._session = session  # ...as session.updated shows it
        self.conversation = conversation
        self.response: ResponsePresenter | None = None
        self.tokens = 0
        self.spoken_ms: dict[str, float] = {}  # assistant item → its audio's length
        # After a cancel, units already on their way may still speak: the
        # client hears none of it until the model listens again.
        self.muted = False
        self.extensions = False  # omnilive's own events too (the client asked)

    def prepared(
        self, session_id: str, prompt_length: int, recording_id: str | None, extra: dict[str, Any]
    ) -> Event | None:
        if not self.extensions:
            return None
        return server_event(
            "omnilive.session.ready",
            prompt_tokens=prompt_length,
            recording_session_id=recording_id,
            warnings=extra.get("warnings", []),
        )

    def unit(self, unit: DuplexUnit, chunk: PendingChunk, timing: UnitTiming) -> list[Event]:
        if unit.is_listen:
            self.muted = False
            return self.close("completed") if self.response is not None else []
        if self.muted:
            return []
        events: list[Event] = []
        if self.response is None:
            config = self._config()
            self.response = ResponsePresenter(
                "audio" in config.output_modalities,
                config.audio.output.format.type,
                self.conversation,
            )
            self.tokens = 0
            events += self.response.created()
        self.tokens += unit.n_tokens
        events += self.response.chunk(unit.text, unit.audio)
        if unit.end_of_turn:
            events += self.close("completed")
        return events

    def close(self, status: str, reason: str | None = None) -> list[Event]:
        """End the open response (its items joined the conversation as they came)."""
        response, self.response = self.response, None
        if response is None:
            return []
        self.muted = status == "cancelled"
        spoken = response.spoken_ms
        events = response.done(status, usage(0, self.tokens, response.audio), reason)
        for item in response.output:
            self.spoken_ms[item["id"]] = spoken
        return events

    def error(self, code: ErrorCode, message: str) -> Event:
        kind = "server_error" if code is ErrorCode.INFERENCE_ERROR else "invalid_request_error"
        return error_event(_CODES.get(code, "invalid_value"), message, kind=kind)

    # The GA dialect has no pause: the gateway never sends one.
    def paused(self, timeout: float) -> Event:
        return error_event("unsupported", "the OpenAI dialect has no pause")

    def resumed(self) -> Event:
        return error_event("unsupported", "the OpenAI dialect has no resume")

    def updated(self, applied: list[str], warnings: list[str]) -> Event:
        return server_event("session.updated", session=self._session())

    def ended(self, reason: str, elapsed_s: float, detail: str | None = None) -> Event | None:
        if reason == "stopped":  # the client ended it: the socket closes
            return (
                server_event("omnilive.session.closed", reason=reason) if self.extensions else None
            )
        code = _ENDS.get(reason, "session_expired")
        return error_event(code, f"the session ended: {reason} after {elapsed_s:.0f} s")

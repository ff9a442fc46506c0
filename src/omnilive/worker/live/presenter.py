"""The full-duplex unit loop as OpenAI's Live API: omnilive's mapping,
without I/O.

The model decides every second whether to listen or speak; there are no
turns or responses on the wire. Each speaking unit is its speech
(``session.output_audio.delta``, in the session's format) and its text
(``session.output_transcript.delta``) placed on the session's timeline:
the unit ends where its second of input ends, and its speech starts there,
or where the last unit's speech ended if that is later. Every
:data:`USAGE_EVERY_UNITS` units the session's usage and its context's fill
(``session.usage.updated``) follow. The loop's own messages (ready,
updated, errors, its ends) are Live events (``session.started``,
``session.updated``, ``error``, ``session.closed``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from omnilive.audio import OUTPUT_RATE
from omnilive.audio_codecs import encode_output
from omnilive.engines.messages import DuplexUnit
from omnilive.protocol.common import ErrorCode
from omnilive.protocol.openai_live import PcmFormat, SessionConfig
from omnilive.protocol.openai_live_events import (
    CloseReason,
    error_event,
    output_audio,
    session_closed,
    session_started,
    session_updated,
    transcript,
    usage_updated,
)
from omnilive.worker.chunk_buffer import PendingChunk
from omnilive.worker.presenters import UnitTiming

Event = dict[str, Any]
UNIT_MS = 1000  # the unit loop's unit of input
USAGE_EVERY_UNITS = 5
_CODES = {
    ErrorCode.INFERENCE_ERROR: "inference_error",
    ErrorCode.UNSUPPORTED: "unsupported",
    ErrorCode.PAYLOAD_TOO_LARGE: "payload_too_large",
    ErrorCode.NOT_READY: "unsupported",
}
# How a session the loop ended closes, and the error that says why first.
_ENDS: dict[str, tuple[CloseReason, str | None]] = {
    "stopped": ("close_requested", None),
    "timeout": ("expired", "session_expired"),
    "idle": ("expired", "session_expired"),
    "pause": ("expired", "session_expired"),
    "context_full": ("expired", "session_expired"),
}


class LivePresenter:
    def __init__(
        self,
        config: Callable[[], SessionConfig],
        resource: Callable[[], Event],
        context_limit: Callable[[], int | None],
    ) -> None:
        self._config = config  # the session's configuration as it stands
        self._resource = resource  # ...as session.* events show it
        self._context_limit = context_limit
        self.start_event_id: str | None = None  # session.start's, echoed by session.started
        self.spoken_until_ms = 0  # where the model's speech so far ends on the timeline
        self.elapsed_s: Callable[[], float] = lambda: 0.0
        self.units = 0
        self.on_said: Callable[[str], None] = lambda text: None  # the model's words, as said

    def prepared(
        self, session_id: str, prompt_length: int, recording_id: str | None, extra: dict[str, Any]
    ) -> Event | None:
        return session_started(self._resource(), self.start_event_id)

    def unit(self, unit: DuplexUnit, chunk: PendingChunk, timing: UnitTiming) -> list[Event]:
        self.units += 1
        events: list[Event] = []
        audio = unit.audio if unit.audio is not None and unit.audio.size else None
        if not unit.is_listen and (audio is not None or unit.text):
            start = max((chunk.index + 1) * UNIT_MS, self.spoken_until_ms)
            length = round(audio.size / OUTPUT_RATE * 1000) if audio is not None else 0
            self.spoken_until_ms = start + length
            if audio is not None:
                fmt = self._config().audio.format
                rate = fmt.rate if isinstance(fmt, PcmFormat) else None
                events.append(output_audio(encode_output(audio, fmt.type, rate)))
            if unit.text:
                events.append(transcript("output", unit.text, start, start + length))
                self.on_said(unit.text)
        if self.units % USAGE_EVERY_UNITS == 0:
            events.append(self.usage(unit.kv_cache_length, unit.context_capacity))
        return events

    def usage(self, kv_length: int, capacity: int | None = None) -> Event:
        limit = capacity or self._context_limit()
        ratio = kv_length / limit if limit else None
        return usage_updated(self.elapsed_s(), ratio)

    def error(self, code: ErrorCode, message: str) -> Event:
        kind = "server_error" if code is ErrorCode.INFERENCE_ERROR else "invalid_request_error"
        return error_event(_CODES.get(code, "invalid_value"), message, kind=kind)

    # The Live API has no pause: the gateway never sends one.
    def paused(self, timeout: float) -> Event:
        return error_event("unsupported", "the Live API has no pause")

    def resumed(self) -> Event:
        return error_event("unsupported", "the Live API has no resume")

    def updated(self, applied: list[str], warnings: list[str]) -> Event:
        return session_updated(self._resource(), None)

    def ended(self, reason: str, elapsed_s: float, detail: str | None = None) -> Event | None:
        why, _ = _ENDS.get(reason, ("expired", "session_expired"))
        return session_closed(self._resource(), why, elapsed_s, None)

    def end_error(self, reason: str, elapsed_s: float) -> Event | None:
        """The error that says why the loop ended the session, before ``session.closed``."""
        _, code = _ENDS.get(reason, ("expired", "session_expired"))
        if code is None:
            return None
        return error_event(code, f"the session ended: {reason} after {elapsed_s:.0f} s")

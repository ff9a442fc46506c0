"""How a duplex session's events look on the wire.

The unit loop is the same for ``/ws/duplex`` and the Realtime API; only the
messages differ. A presenter turns the loop's typed events into one dialect.
The realtime one also re-frames speech so that every middle delta carries
exactly one second of audio, as that API promises.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from omnilive.audio import OUTPUT_RATE, pcm_to_b64
from omnilive.engines.messages import DuplexUnit
from omnilive.protocol.common import ErrorCode, error_message
from omnilive.protocol.duplex import (
    RESUMED,
    STOPPED,
    paused_message,
    prepared_message,
    timeout_message,
    updated_message,
)
from omnilive.protocol.realtime import (
    CloseReason,
    RealtimeErrorCode,
    closed_event,
    created_event,
    delta_event,
    error_event,
    listen_event,
    updated_event,
)
from omnilive.worker.chunk_buffer import PendingChunk


@dataclass
class UnitTiming:
    prefill_ms: float
    generate_ms: float
    session_start: float  # monotonic
    vision_slices: int
    vision_tokens: int
    dropped_total: int
    audio_tokens: int = 0  # input tokens the unit added, for usage accounting
    text_tokens: int = 0


class Presenter(Protocol):
    """A dialect's messages; None where the dialect has nothing to say."""

    def prepared(
        self, session_id: str, prompt_length: int, recording_id: str | None, extra: dict[str, Any]
    ) -> dict[str, Any] | None: ...

    def unit(self, unit: DuplexUnit, chunk: PendingChunk, timing: UnitTiming) -> list[dict]: ...

    def error(self, code: ErrorCode, message: str) -> dict[str, Any]: ...

    def paused(self, timeout: float) -> dict[str, Any]: ...

    def resumed(self) -> dict[str, Any]: ...

    def updated(self, applied: list[str], warnings: list[str]) -> dict[str, Any]: ...

    def ended(
        self, reason: str, elapsed_s: float, detail: str | None = None
    ) -> dict[str, Any] | None: ...


class DuplexPresenter:
    """``/ws/duplex``: one ``result`` per processed chunk."""

    def prepared(
        self, session_id: str, prompt_length: int, recording_id: str | None, extra: dict[str, Any]
    ) -> dict[str, Any]:
        message = prepared_message(
            session_id, prompt_length, recording_id, extra["mode"], extra["capabilities"]
        )
        return {**message, "warnings": extra.get("warnings", [])}

    def unit(self, unit: DuplexUnit, chunk: PendingChunk, timing: UnitTiming) -> list[dict]:
        audio = unit.audio if unit.audio is not None and unit.audio.size else None
        return [
            {
                "type": "result",
                "is_listen": unit.is_listen,
                "text": unit.text,
                "audio_data": pcm_to_b64(audio) if audio is not None else None,
                "end_of_turn": unit.end_of_turn,
                "current_time": round(chunk.received_at - timing.session_start, 3),
                "unit_index": chunk.index,
                "cost_prefill_ms": round(timing.prefill_ms, 1),
                "cost_llm_ms": round(unit.cost_llm_ms or timing.generate_ms, 1),
                "cost_tts_prep_ms": round(unit.cost_tts_prep_ms, 1),
                "cost_tts_ms": round(unit.cost_tts_ms, 1),
                "cost_token2wav_ms": round(unit.cost_token2wav_ms, 1),
                "cost_all_ms": round(timing.prefill_ms + timing.generate_ms, 1),
                "n_tokens": unit.n_tokens,
                "n_tts_tokens": unit.n_tts_tokens,
                "server_send_ts": round(time.time() * 1000),
                "wall_clock_ms": round((time.monotonic() - chunk.received_at) * 1000, 1),
                "kv_cache_length": unit.kv_cache_length,
                # omnilive's: the context's room and the units its window let go so far
                "context_capacity": unit.context_capacity,
                "evicted_units": unit.evicted_units,
                "vision_slices": timing.vision_slices,
                "vision_tokens": timing.vision_tokens,
                "dropped_chunks": chunk.dropped_before,
                "dropped_chunks_total": timing.dropped_total,
            }
        ]

    def error(self, code: ErrorCode, message: str) -> dict[str, Any]:
        return error_message(message, code)

    def paused(self, timeout: float) -> dict[str, Any]:
        return paused_message(timeout)

    def resumed(self) -> dict[str, Any]:
        return RESUMED

    def updated(self, applied: list[str], warnings: list[str]) -> dict[str, Any]:
        return updated_message(applied, warnings)

    def ended(self, reason: str, elapsed_s: float, detail: str | None = None) -> dict[str, Any]:
        if reason == "stopped":
            return STOPPED
        return timeout_message(reason, elapsed_s)


_REALTIME_CODES = {
    ErrorCode.NOT_READY: RealtimeErrorCode.NOT_READY,
    ErrorCode.UNKNOWN_TYPE: RealtimeErrorCode.UNKNOWN_EVENT,
    ErrorCode.INFERENCE_ERROR: RealtimeErrorCode.INFERENCE_ERROR,
}


class RealtimePresenter:
    """Realtime events: ``response.listen`` and ``response.output_audio.delta``.

    Speech is re-framed: the first delta of a turn may be shorter than a
    second (it goes out at once), middle deltas are exactly one second, the
    last (``end_of_turn``) may be shorter. Text rides on the next delta sent.
    """

    def __init__(self, frame_samples: int = OUTPUT_RATE) -> None:
        self.frame = frame_samples
        self._audio = np.zeros(0, np.float32)
        self._text = ""
        self._first = True

    def prepared(
        self, session_id: str, prompt_length: int, recording_id: str | None, extra: dict[str, Any]
    ) -> dict[str, Any]:
        event = created_event(session_id, prompt_length, recording_id)
        return {**event, "warnings": extra.get("warnings", [])}

    def _delta(self, samples: np.ndarray, end: bool, kv: int) -> dict[str, Any]:
        text, self._text = self._text, ""
        return delta_event(text, pcm_to_b64(samples), end, kv)

    def _flush(self, kv: int) -> list[dict[str, Any]]:
        """End the turn: whole seconds, then the remainder as the last delta."""
        events = []
        while self._audio.size > self.frame:
            events.append(self._delta(self._audio[: self.frame], False, kv))
            self._audio = self._audio[self.frame :]
        events.append(self._delta(self._audio, True, kv))
        self._audio = np.zeros(0, np.float32)
        self._first = True
        return events

    def unit(self, unit: DuplexUnit, chunk: PendingChunk, timing: UnitTiming) -> list[dict]:
        kv = unit.kv_cache_length
        if unit.is_listen:
            events = self._flush(kv) if self._audio.size or self._text else []
            return [*events, listen_event(kv)]
        self._text += unit.text
        if unit.audio is not None and unit.audio.size:
            self._audio = np.concatenate([self._audio, unit.audio.astype(np.float32)])
        if unit.end_of_turn:
            return self._flush(kv)
        events = []
        if self._first and self._audio.size:
            first = min(self._audio.size, self.frame)
            events.append(self._delta(self._audio[:first], False, kv))
            self._audio = self._audio[first:]
            self._first = False
        while self._audio.size >= self.frame:
            events.append(self._delta(self._audio[: self.frame], False, kv))
            self._audio = self._audio[self.frame :]
        return events

    def error(self, code: ErrorCode, message: str) -> dict[str, Any]:
        return error_event(_REALTIME_CODES.get(code, RealtimeErrorCode.INVALID_PAYLOAD), message)

    # The Realtime API has no pause: the gateway never sends one. A client of
    # the duplex protocol that asked for Realtime events and pauses is told so.
    def paused(self, timeout: float) -> dict[str, Any]:
        return error_event(RealtimeErrorCode.UNKNOWN_EVENT, "the Realtime API has no pause")

    def resumed(self) -> dict[str, Any]:
        return error_event(RealtimeErrorCode.UNKNOWN_EVENT, "the Realtime API has no resume")

    def updated(self, applied: list[str], warnings: list[str]) -> dict[str, Any]:
        return updated_event({name: True for name in applied}, warnings)

    def ended(self, reason: str, elapsed_s: float, detail: str | None = None) -> dict[str, Any]:
        known = {r.value for r in CloseReason}
        return closed_event(CloseReason(reason) if reason in known else CloseReason.TIMEOUT)

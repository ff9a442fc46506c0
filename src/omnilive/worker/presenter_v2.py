"""The duplex unit loop in the Realtime API's newer dialect (spec/realtime-v2.md).

Per unit, in the reference backend's order: one ``listen`` delta if the model
listens (carrying the id of the response that just ended, if any); otherwise
a ``text`` delta (if any text), then an ``audio`` delta, each tagged with a
``response_id`` minted on the first speaking unit of a turn, and an extra
``listen`` delta when the unit ends the turn. Every delta of a unit also
carries its usage accounting (``chunk_index``, ``chunk_usage``, the cumulative
``usage``), as the dialect's description says: a client may read it from any
event (the public SDK reads it from audio deltas only). Every error is fatal
in this dialect.
"""

from __future__ import annotations

import time
from typing import Any

from omnilive.audio import OUTPUT_RATE, pcm_to_b64
from omnilive.engines.messages import DuplexUnit
from omnilive.protocol.common import ErrorCode
from omnilive.protocol.realtime_v2 import (
    TokenUsage,
    UsageMeter,
    V2Reason,
    closed_event,
    event,
    new_response_id,
    output_delta,
)
from omnilive.worker.chunk_buffer import PendingChunk
from omnilive.worker.presenters import UnitTiming

# The worker's ends, as this dialect names them.
_REASONS = {
    "stopped": V2Reason.CLIENT_CLOSED,  # unless the client named its reason
    "timeout": V2Reason.TIMEOUT,
    "idle": V2Reason.TIMEOUT,
    "pause": V2Reason.TIMEOUT,
    "server_shutdown": V2Reason.SERVER_SHUTDOWN,
}


class RealtimeV2Presenter:
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.usage = UsageMeter()
        self._response_id: str | None = None

    def prepared(
        self, session_id: str, prompt_length: int, recording_id: str | None, extra: dict[str, Any]
    ) -> dict[str, Any]:
        self.usage.total.add(TokenUsage(input_text=prompt_length))
        return event(
            "session.created",
            session_id=self.session_id,
            mode="full_duplex",
            metrics={"kv_cache_length": prompt_length},
            usage=self.usage.total.to_dict(),
            recording_session_id=recording_id,
            warnings=extra.get("warnings") or None,
        )

    def unit(self, unit: DuplexUnit, chunk: PendingChunk, timing: UnitTiming) -> list[dict]:
        frames = bool(chunk.frames)
        step = TokenUsage(
            input_text=timing.text_tokens,
            input_audio=timing.audio_tokens,
            input_video=timing.vision_tokens if frames else 0,
            output_text=unit.n_tokens,
            output_audio=unit.n_tts_tokens,
        )
        usage = self.usage.step(step)
        common = {
            "session_id": self.session_id,
            "input_id": chunk.input_id,
            "metrics": _metrics(unit, chunk, timing),
        }
        deltas: list[dict[str, Any]] = []

        def delta(kind: Any, **fields: Any) -> None:
            deltas.append(output_delta(kind, **common, **usage, **fields))

        if unit.is_listen:
            ended, self._response_id = self._response_id, None
            delta("listen", response_id=ended)
            return deltas
        self._response_id = self._response_id or new_response_id()
        if unit.text:
            delta("text", response_id=self._response_id, text=unit.text)
        if unit.audio is not None and unit.audio.size:
            audio = pcm_to_b64(unit.audio)
            delta("audio", response_id=self._response_id, audio=audio, sample_rate=OUTPUT_RATE)
        if unit.end_of_turn:  # the turn's boundary: a listen after its output
            delta("listen", response_id=self._response_id)
            self._response_id = None
        return deltas

    def error(self, code: ErrorCode, message: str) -> dict[str, Any]:
        return self._closed(V2Reason.BACKEND_ERROR, f"{code}: {message}")

    def paused(self, timeout: float) -> dict[str, Any]:
        return self._closed(V2Reason.BACKEND_ERROR, "this dialect has no pause")

    def resumed(self) -> dict[str, Any]:
        return self._closed(V2Reason.BACKEND_ERROR, "this dialect has no resume")

    def updated(self, applied: list[str], warnings: list[str]) -> dict[str, Any]:
        return self._closed(V2Reason.BACKEND_ERROR, "session.init is sent once")

    def ended(self, reason: str, elapsed_s: float, detail: str | None = None) -> dict[str, Any]:
        if reason == "context_full":
            return self._closed(V2Reason.BACKEND_ERROR, "the context is full")
        if reason == "stopped" and detail:
            return self._closed(detail)  # the client's own reason, echoed
        return self._closed(_REASONS.get(reason, V2Reason.BACKEND_ERROR))

    def _closed(self, reason: str, message: str | None = None) -> dict[str, Any]:
        return closed_event(self.session_id, reason, message, self.usage.total.to_dict())


def _metrics(unit: DuplexUnit, chunk: PendingChunk, timing: UnitTiming) -> dict[str, Any]:
    return {
        "kv_cache_length": unit.kv_cache_length,
        "context_capacity": unit.context_capacity,
        "evicted_units": unit.evicted_units,
        "prefill_ms": round(timing.prefill_ms, 1),
        "generate_ms": round(timing.generate_ms, 1),
        "wall_clock_ms": round((time.monotonic() - chunk.received_at) * 1000, 1),
        "cost_llm_ms": round(unit.cost_llm_ms, 1),
        "cost_tts_prep_ms": round(unit.cost_tts_prep_ms, 1),
        "cost_tts_ms": round(unit.cost_tts_ms, 1),
        "cost_token2wav_ms": round(unit.cost_token2wav_ms, 1),
        "n_tokens": unit.n_tokens,
        "n_tts_tokens": unit.n_tts_tokens,
        "vision_slices": timing.vision_slices,
        "vision_tokens": timing.vision_tokens,
        "dropped_chunks": chunk.dropped_before,
    }

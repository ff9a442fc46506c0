"""The Realtime API (``WS /v1/realtime?mode=video|audio``): spec/realtime-api.md.

Client events are validated here with the spec's error codes: a missing
required field is ``missing_field``; any other bad value ``invalid_payload``;
an unknown ``type`` ``unknown_event``. Unknown fields are ignored.

Beyond the spec, as tolerant as the reference's clients need: ``instructions``
is optional, voices are WAV files or raw float32 PCM, appends may be of any
length (the worker assembles 1 s units), and ``response.cancel`` ends the
model's turn (``response.cancelled``).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from omnilive.ids import is_safe_id
from omnilive.protocol.common import (
    ContextWindowOption,
    ProtocolError,
    check_float32,
    check_voice,
    decoded_length,
    strict_base64,
)

CLOSE_UNSUPPORTED_DATA = 1003  # a frame that is not JSON

_MODEL = ConfigDict(extra="ignore", frozen=True)


class RealtimeErrorCode(StrEnum):
    NOT_READY = "not_ready"
    UNKNOWN_EVENT = "unknown_event"
    MISSING_FIELD = "missing_field"
    INVALID_PAYLOAD = "invalid_payload"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    SERVICE_UNAVAILABLE = "service_unavailable"
    QUEUE_FULL = "queue_full"
    WORKER_BUSY = "worker_busy"
    WORKER_CONNECT_FAILED = "worker_connect_failed"
    INFERENCE_ERROR = "inference_error"
    APP_DISABLED = "app_disabled"
    RESUME_REFUSED = "resume_refused"


CLIENT_ERRORS = {
    RealtimeErrorCode.NOT_READY,
    RealtimeErrorCode.UNKNOWN_EVENT,
    RealtimeErrorCode.MISSING_FIELD,
    RealtimeErrorCode.INVALID_PAYLOAD,
    RealtimeErrorCode.PAYLOAD_TOO_LARGE,
    RealtimeErrorCode.APP_DISABLED,
    RealtimeErrorCode.RESUME_REFUSED,
}


class CloseReason(StrEnum):
    STOPPED = "stopped"
    TIMEOUT = "timeout"
    CONTEXT_FULL = "context_full"
    SERVER_SHUTDOWN = "server_shutdown"
    ERROR = "error"


DEFAULT_INSTRUCTIONS = "You are a helpful assistant. Reply briefly and naturally."


class SessionConfig(BaseModel):
    model_config = _MODEL
    instructions: str | None = None  # the default prompt when absent
    max_slice_nums: int = Field(1, ge=1, le=9)
    ref_audio: str | None = None  # base64: a WAV file or raw float32 PCM, 16 kHz
    tts_ref_audio: str | None = None  # falls back to ref_audio
    # Stored voices, used where the matching audio field is absent.
    ref_audio_id: str | None = None
    tts_ref_audio_id: str | None = None
    recording: bool = True
    # omnilive's extension: the session's own sliding context ("off": the
    # spec's fixed context, ending context_full).
    context_window: ContextWindowOption | None = None

    @field_validator("ref_audio", "tts_ref_audio")
    @classmethod
    def _voice(cls, value: str | None) -> str | None:
        return None if value is None else check_voice(strict_base64(value))

    @field_validator("ref_audio_id", "tts_ref_audio_id")
    @classmethod
    def _voice_id(cls, value: str | None) -> str | None:
        if value is not None and not is_safe_id(value):
            raise ValueError("a voice id is 1-128 of A-Z a-z 0-9 _ -")
        return value


class SessionUpdate(BaseModel):
    model_config = _MODEL
    type: Literal["session.update"]
    session: SessionConfig


class Append(BaseModel):
    model_config = _MODEL
    type: Literal["input_audio_buffer.append"]
    audio: str
    video_frames: list[str] | None = None
    force_listen: bool = False
    max_slice_nums: int | None = Field(None, ge=1, le=9)

    @field_validator("audio")
    @classmethod
    def _audio(cls, value: str) -> str:
        check_float32(strict_base64(value))
        if not decoded_length(value):
            raise ValueError("audio is empty")
        return value

    @field_validator("video_frames")
    @classmethod
    def _frames(cls, value: list[str] | None) -> list[str] | None:
        for frame in value or []:
            strict_base64(frame)
        return value


class SessionClose(BaseModel):
    model_config = _MODEL
    type: Literal["session.close"]
    reason: str | None = None


class ResponseCancel(BaseModel):
    """End the model's current turn, as a force-listen would."""

    model_config = _MODEL
    type: Literal["response.cancel"]


ClientEvent = SessionUpdate | Append | SessionClose | ResponseCancel
# The events that tell this dialect from the newer one (``session.close`` is in both).
V1_EVENT_TYPES = frozenset({"session.update", "input_audio_buffer.append", "response.cancel"})
_EVENTS: dict[str, type[BaseModel]] = {
    "session.update": SessionUpdate,
    "input_audio_buffer.append": Append,
    "session.close": SessionClose,
    "response.cancel": ResponseCancel,
}


def parse_event(data: dict[str, Any]) -> ClientEvent:
    """A decoded JSON object → a typed client event, or a :class:`ProtocolError`."""
    kind = data.get("type")
    if kind is None:
        raise ProtocolError(RealtimeErrorCode.MISSING_FIELD, "type field is required")
    model = _EVENTS.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise ProtocolError(RealtimeErrorCode.UNKNOWN_EVENT, f"unknown event type {kind!r}")
    try:
        return model.model_validate(data)  # type: ignore[return-value]  # _EVENTS holds only ClientEvent types
    except ValidationError as exc:
        errors = exc.errors(include_input=False, include_url=False)
        missing = [e for e in errors if e["type"] == "missing"]
        first = (missing or errors)[0]
        where = ".".join(str(p) for p in first["loc"])
        if missing:
            raise ProtocolError(
                RealtimeErrorCode.MISSING_FIELD, f"{where} field is required"
            ) from None
        raise ProtocolError(RealtimeErrorCode.INVALID_PAYLOAD, f"{where}: {first['msg']}") from None


def error_event(code: RealtimeErrorCode | str, message: str) -> dict[str, Any]:
    kind = "client_error" if code in CLIENT_ERRORS else "server_error"
    return {"type": "error", "error": {"code": str(code), "message": message, "type": kind}}


def refusal_event(refused: ProtocolError[RealtimeErrorCode]) -> dict[str, Any]:
    """This dialect's presenter of a refusal: its ``error`` event."""
    return error_event(refused.code, refused.message)


def closed_event(reason: CloseReason) -> dict[str, Any]:
    return {"type": "session.closed", "reason": str(reason)}


def created_event(session_id: str, prompt_length: int, recording_id: str | None) -> dict:
    return {
        "type": "session.created",
        "session_id": session_id,
        "prompt_length": prompt_length,
        "recording_session_id": recording_id,
    }


def delta_event(text: str, audio_b64: str, end_of_turn: bool, kv: int) -> dict[str, Any]:
    return {
        "type": "response.output_audio.delta",
        "text": text,
        "audio": audio_b64,
        "end_of_turn": end_of_turn,
        "kv_cache_length": kv,
    }


def updated_event(session: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
    """A later ``session.update`` applied: what changed, and what could not."""
    return {"type": "session.updated", "session": session, "warnings": warnings}


def cancelled_event() -> dict[str, Any]:
    return {"type": "response.cancelled"}


def listen_event(kv: int) -> dict[str, Any]:
    return {"type": "response.listen", "kv_cache_length": kv}


QUEUE_EVENT_NAMES = {
    "queued": "session.queued",
    "queue_update": "session.queue_update",
    "queue_done": "session.queue_done",
}

"""The Realtime API's newer dialect: spec/realtime-v2.md.

``session.init`` / ``input.append`` / ``session.close`` in;
``session.created``, ``response.output.delta{kind: listen|text|audio}``,
``response.done`` (chat), ``session.closed`` out; the queue events are the
older dialect's. There are no recoverable client errors: a violation is fatal
(``session.closed{reason: backend_error, diagnostic}``, close 1011). Field
aliases follow the reference backend (``instructions`` for ``system_prompt``,
``voice.ref_audio`` for ``voice.ref_audio_base64``, ...); unknown fields are
ignored.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from omnilive.protocol.common import (
    ProtocolError,
    check_float32,
    check_voice,
    decoded_length,
    strict_base64,
)
from omnilive.protocol.realtime import SessionClose as SessionClose  # both dialects': re-exported

_MODEL = ConfigDict(extra="ignore", frozen=True)
CLOSE_FATAL = 1011  # the reference closes every fatal condition with this


class V2Reason(StrEnum):
    """``session.closed`` reasons."""

    USER_STOP = "user_stop"
    CLIENT_CLOSED = "client_closed"
    TIMEOUT = "timeout"
    BACKEND_ERROR = "backend_error"
    SERVER_SHUTDOWN = "server_shutdown"


def violation(message: str) -> ProtocolError[V2Reason]:
    """This dialect's refusal. It has no error event: every refusal is a
    fatal protocol violation, and the session ends with ``backend_error``
    (the machine's presenter, ``session.closed`` with the message)."""
    return ProtocolError(V2Reason.BACKEND_ERROR, message)


def _voice(value: str | None) -> str | None:
    return None if value is None else check_voice(strict_base64(value))


class Voice(BaseModel):
    model_config = _MODEL
    ref_audio_base64: str | None = Field(
        None, validation_alias=AliasChoices("ref_audio_base64", "ref_audio")
    )
    tts_ref_audio_base64: str | None = Field(
        None, validation_alias=AliasChoices("tts_ref_audio_base64", "tts_ref_audio")
    )

    _check = field_validator("ref_audio_base64", "tts_ref_audio_base64")(_voice)


class InitPayload(BaseModel):
    """``session.init.payload``; chat sessions send ``{}``."""

    model_config = _MODEL
    system_prompt: str | None = Field(
        None, validation_alias=AliasChoices("system_prompt", "instructions")
    )
    config: dict[str, Any] = Field(
        default_factory=dict, validation_alias=AliasChoices("config", "duplex")
    )
    voice: Voice = Field(default_factory=Voice, validation_alias=AliasChoices("voice", "defaults"))
    ref_audio_base64: str | None = None  # the backend's top-level spellings
    tts_ref_audio_base64: str | None = None
    max_slice_nums: int = Field(1, ge=1, le=9)
    recording: bool = True

    _check = field_validator("ref_audio_base64", "tts_ref_audio_base64")(_voice)

    @property
    def llm_voice(self) -> str | None:
        return self.voice.ref_audio_base64 or self.ref_audio_base64

    @property
    def tts_voice(self) -> str | None:
        """The TTS voice falls back to the LLM's reference voice."""
        return self.voice.tts_ref_audio_base64 or self.tts_ref_audio_base64 or self.llm_voice


class SessionInit(BaseModel):
    model_config = _MODEL
    type: Literal["session.init"]
    payload: InitPayload


class Hints(BaseModel):
    model_config = _MODEL
    force_listen: bool | None = None
    max_slice_nums: int | list[int] | None = None


def _frame_data(frame: Any) -> str:
    if isinstance(frame, dict):
        frame = frame.get("data") or frame.get("base64")
    if not isinstance(frame, str):
        raise ValueError("a frame is base64 JPEG, or {data}")
    return strict_base64(frame)


class DuplexInput(BaseModel):
    """``input.append.input`` of a video or audio session: one slice of time."""

    model_config = _MODEL
    audio: str
    video_frames: list[str] = Field(default_factory=list)
    force_listen: bool = False
    max_slice_nums: int | list[int] | None = None
    hints: Hints = Field(default_factory=Hints)
    input_id: str | None = Field(None, max_length=256)

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        """The backend's other spellings of the audio and the frames."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        audio = data.get("audio")
        if isinstance(audio, dict):
            data["audio"] = audio.get("data") or audio.get("base64") or audio.get("audio_base64")
        for key in ("audio_base64", "audio_data"):
            if not data.get("audio") and isinstance(data.get(key), str):
                data["audio"] = data[key]
        if not data.get("video_frames"):
            data["video_frames"] = data.get("frame_base64_list") or data.get("frames") or []
        return data

    @field_validator("audio")
    @classmethod
    def _audio(cls, value: str) -> str:
        check_float32(strict_base64(value))
        if not decoded_length(value):
            raise ValueError("audio is empty")
        return value

    @field_validator("video_frames", mode="before")
    @classmethod
    def _frames(cls, value: Any) -> list[str]:
        if not isinstance(value, list):
            raise ValueError("video_frames is a list")
        return [_frame_data(frame) for frame in value]

    @property
    def listen_forced(self) -> bool:
        return self.force_listen or bool(self.hints.force_listen)

    @property
    def slice_nums(self) -> int | None:
        """One number for the unit; a list (one per frame) gives its largest."""
        value = self.max_slice_nums
        if value is None:
            value = self.hints.max_slice_nums
        if isinstance(value, list):
            if len(value) != len(self.video_frames):
                raise ValueError("max_slice_nums has one entry per frame")
            value = max(value, default=None)
        if value is not None and not 1 <= value <= 9:
            raise ValueError("max_slice_nums is between 1 and 9")
        return value


class InputAppend(BaseModel):
    model_config = _MODEL
    type: Literal["input.append"]
    input: dict[str, Any]


ClientEvent = SessionInit | InputAppend | SessionClose
_EVENTS: dict[str, type[BaseModel]] = {
    "session.init": SessionInit,
    "input.append": InputAppend,
    "session.close": SessionClose,
}
# The events that tell the two dialects apart (``session.close`` is in both).
V2_EVENT_TYPES = frozenset({"session.init", "input.append"})


def _problem(exc: ValidationError) -> str:
    first = exc.errors(include_input=False, include_url=False)[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"{where or 'event'}: {first['msg']}"


def parse_event(data: dict[str, Any]) -> ClientEvent:
    """A decoded JSON object → a typed event, or this dialect's :func:`violation`."""
    kind = data.get("type")
    model = _EVENTS.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise violation(f"unknown event type {data.get('type')!r}")
    try:
        return model.model_validate(data)  # type: ignore[return-value]  # _EVENTS holds only ClientEvent types
    except ValidationError as exc:
        raise violation(_problem(exc)) from None


def parse_duplex_input(event: InputAppend) -> DuplexInput:
    try:
        parsed = DuplexInput.model_validate(event.input)
        parsed.slice_nums  # noqa: B018 - validates the per-frame list
    except ValidationError as exc:
        raise violation(f"input.{_problem(exc)}") from None
    except ValueError as exc:
        raise violation(f"input: {exc}") from None
    return parsed


# --- usage ---------------------------------------------------------------------------


@dataclass
class TokenUsage:
    """Tokens in and out, by modality, of a step or a whole session."""

    input_text: int = 0
    input_audio: int = 0
    input_image: int = 0
    input_video: int = 0
    output_text: int = 0
    output_audio: int = 0

    def add(self, other: TokenUsage) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def to_dict(self) -> dict[str, Any]:
        """The reference's usage object; ``vision_tokens`` (images and video
        together) is added because the public SDK reads that name."""
        inputs = self.input_text + self.input_audio + self.input_image + self.input_video
        outputs = self.output_text + self.output_audio
        return {
            "total_tokens": inputs + outputs,
            "input_tokens": inputs,
            "output_tokens": outputs,
            "input_token_details": {
                "text_tokens": self.input_text,
                "audio_tokens": self.input_audio,
                "image_tokens": self.input_image,
                "video_tokens": self.input_video,
                "vision_tokens": self.input_image + self.input_video,
                "cached_tokens": 0,
            },
            "output_token_details": {
                "text_tokens": self.output_text,
                "audio_tokens": self.output_audio,
            },
        }


class UsageMeter:
    """Per-step usage plus the session's running total (``chunk_index``,
    ``chunk_usage``, ``usage`` on the first output event of each step)."""

    def __init__(self) -> None:
        self.total = TokenUsage()
        self.steps = 0

    def step(self, usage: TokenUsage) -> dict[str, Any]:
        self.total.add(usage)
        fields = {
            "chunk_index": self.steps,
            "chunk_usage": usage.to_dict(),
            "usage": self.total.to_dict(),
        }
        self.steps += 1
        return fields


# --- server events -------------------------------------------------------------------


def new_response_id() -> str:
    return f"resp_{secrets.token_hex(6)}"


def event(event_type: str, /, **fields: Any) -> dict[str, Any]:
    """A server event; fields that are None are left out, as the reference does."""
    body = {"type": event_type, **{k: v for k, v in fields.items() if v is not None}}
    body["server_send_ts"] = time.time()
    return body


def output_delta(kind: Literal["listen", "text", "audio"], **fields: Any) -> dict[str, Any]:
    return event("response.output.delta", kind=kind, **fields)


def closed_event(
    session_id: str, reason: str, message: str | None = None, usage: dict[str, Any] | None = None
) -> dict[str, Any]:
    diagnostic = {"message": message} if message else None
    return event(
        "session.closed", session_id=session_id, reason=reason, diagnostic=diagnostic, usage=usage
    )

"""Full duplex, audio and omni (``WS /ws/duplex/{session_id}``): spec/duplex.md
with the fields the reference implementation actually uses."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from omnilive.protocol.common import (
    Base64Str,
    ContextWindowOption,
    Float32Base64,
    SafeId,
    VoiceBase64,
)

_MODEL = ConfigDict(extra="ignore", frozen=True)
DuplexMode = Literal["audio_duplex", "omni_duplex"]
MODE_ALIASES: dict[str, DuplexMode] = {
    "audio": "audio_duplex",
    "audio_duplex": "audio_duplex",
    "omni": "omni_duplex",
    "omni_duplex": "omni_duplex",
    "video": "omni_duplex",
}


def parse_mode(value: str | None) -> DuplexMode | None:
    return MODE_ALIASES.get(value.lower()) if value else None


class Prepare(BaseModel):
    model_config = _MODEL
    type: Literal["prepare"]
    system_prompt: str = "You are a helpful assistant. Reply briefly and naturally."
    config: dict[str, Any] = Field(default_factory=dict)
    # Reference voices: a WAV file or raw float32 PCM (16 kHz), base64.
    ref_audio_base64: VoiceBase64 | None = None
    tts_ref_audio_base64: VoiceBase64 | None = None
    # Stored voices, used where the matching base64 field is absent.
    ref_audio_id: SafeId | None = None
    tts_ref_audio_id: SafeId | None = None
    ref_audio_path: str | None = None  # refused: clients never name server files
    deferred_finalize: bool = True
    max_slice_nums: int = Field(1, ge=1, le=9)
    mode: str | None = None
    recording: bool = True
    # omnilive's extension: the session's own sliding context (None: the
    # engine's; ``config.context_window`` is read where this is absent, for
    # the Realtime API's clients, whose config passes through).
    context_window: ContextWindowOption | None = None

    @model_validator(mode="after")
    def _check(self) -> Prepare:
        if self.ref_audio_path:
            raise ValueError("ref_audio_path is not accepted; send ref_audio_base64")
        if self.mode is not None and parse_mode(self.mode) is None:
            raise ValueError("mode must be audio_duplex or omni_duplex")
        return self


class ChunkFields(BaseModel):
    """An ``audio_chunk``'s fields beside its media: what the worker reads
    of the binary form the gateway sends it in (``protocol/media_frame.py``)."""

    model_config = _MODEL
    type: Literal["audio_chunk"]
    force_listen: bool = False
    max_slice_nums: int | None = Field(None, ge=1, le=9)
    input_id: str | None = Field(None, max_length=256)  # echoed on what it produces (Realtime)


class AudioChunk(ChunkFields):
    """The client's audio of one unit (float32 PCM at 16 kHz, base64; a
    second as a rule), with camera frames (JPEG, base64) in omni mode."""

    audio_base64: Float32Base64
    frame_base64_list: list[Base64Str] | None = None


class Update(BaseModel):
    """omnilive's extension: new instructions or voice, from the next turn on,
    where the engine can (``updated`` says what it could not)."""

    model_config = _MODEL
    type: Literal["update"]
    system_prompt: str | None = None
    ref_audio_base64: VoiceBase64 | None = None
    tts_ref_audio_base64: VoiceBase64 | None = None
    ref_audio_id: SafeId | None = None
    tts_ref_audio_id: SafeId | None = None


class Pause(BaseModel):
    model_config = _MODEL
    type: Literal["pause"]
    timeout: float | None = Field(None, gt=0)


class Resume(BaseModel):
    model_config = _MODEL
    type: Literal["resume"]


class Stop(BaseModel):
    model_config = _MODEL
    type: Literal["stop"]
    reason: str | None = Field(None, max_length=64)  # echoed by the Realtime API's close


class RealtimeOptions(BaseModel):
    """Internal: sent by the gateway before ``prepare`` when it serves the
    Realtime API over this protocol. Never accepted from a client: the gateway
    validates client frames against ``CLIENT_TYPES``, which lacks it."""

    model_config = _MODEL
    type: Literal["internal.realtime"]
    dialect: Literal["realtime", "realtime_v2"]
    context_limit: int | None = Field(None, ge=1)  # end the session once the KV cache is this full


ClientMessage = Annotated[
    Prepare | AudioChunk | Update | Pause | Resume | Stop, Field(discriminator="type")
]
CLIENT_TYPES = ("prepare", "audio_chunk", "update", "pause", "resume", "stop")
client_message = TypeAdapter(ClientMessage)
# What the worker reads on its session socket: the client's messages, and the gateway's.
WorkerMessage = Annotated[
    Prepare | AudioChunk | Update | Pause | Resume | Stop | RealtimeOptions,
    Field(discriminator="type"),
]
WORKER_TYPES = (*CLIENT_TYPES, "internal.realtime")
worker_message = TypeAdapter(WorkerMessage)


def prepared_message(
    session_id: str,
    prompt_length: int,
    recording_id: str | None,
    mode: DuplexMode,
    capabilities: dict[str, Any],
) -> dict[str, Any]:
    return {
        "type": "prepared",
        "session_id": session_id,
        "prompt_length": prompt_length,
        "recording_session_id": recording_id,
        "mode": mode,
        "vision": bool(capabilities.get("vision")),
        "capabilities": capabilities,
    }


def paused_message(timeout: float) -> dict[str, Any]:
    return {"type": "paused", "timeout": timeout}


def timeout_message(reason: str, elapsed_s: float) -> dict[str, Any]:
    return {"type": "timeout", "reason": reason, "elapsed_s": round(elapsed_s, 1)}


def updated_message(applied: list[str], warnings: list[str]) -> dict[str, Any]:
    return {"type": "updated", "applied": applied, "warnings": warnings}


RESUMED: dict[str, Any] = {"type": "resumed"}
STOPPED: dict[str, Any] = {"type": "stopped"}

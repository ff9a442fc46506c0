"""Full duplex, audio and omni (``WS /ws/duplex/{session_id}``): spec/duplex.md
with the fields the reference implementation actually uses."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from omnilive.protocol.common import Base64Str, Float32Base64, SafeId, check_float32

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
    ref_audio_base64: Base64Str | None = None
    tts_ref_audio_base64: Base64Str | None = None
    # Stored voices, used where the matching base64 field is absent.
    ref_audio_id: SafeId | None = None
    tts_ref_audio_id: SafeId | None = None
    ref_audio_path: str | None = None  # refused: clients never name server files
    deferred_finalize: bool = True
    max_slice_nums: int = Field(1, ge=1, le=9)
    mode: str | None = None
    recording: bool = True
    # Set by the gateway when it serves the Realtime API over this protocol:
    dialect: Literal["duplex", "realtime"] = "duplex"
    context_limit: int | None = Field(None, ge=1)  # end the session once the KV cache is this full
    ref_audio_format: Literal["pcm_f32", "wav"] = "pcm_f32"

    @model_validator(mode="after")
    def _check(self) -> Prepare:
        if self.ref_audio_path:
            raise ValueError("ref_audio_path is not accepted; send ref_audio_base64")
        if self.mode is not None and parse_mode(self.mode) is None:
            raise ValueError("mode must be audio_duplex or omni_duplex")
        for name in ("ref_audio_base64", "tts_ref_audio_base64"):
            value = getattr(self, name)
            if value and self.ref_audio_format == "pcm_f32":
                check_float32(value, name)
        return self


class AudioChunk(BaseModel):
    model_config = _MODEL
    type: Literal["audio_chunk"]
    audio_base64: Float32Base64
    frame_base64_list: list[Base64Str] | None = None
    force_listen: bool = False
    max_slice_nums: int | None = Field(None, ge=1, le=9)


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


ClientMessage = Annotated[Prepare | AudioChunk | Pause | Resume | Stop, Field(discriminator="type")]
CLIENT_TYPES = ("prepare", "audio_chunk", "pause", "resume", "stop")
client_message = TypeAdapter(ClientMessage)


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


RESUMED: dict[str, Any] = {"type": "resumed"}
STOPPED: dict[str, Any] = {"type": "stopped"}

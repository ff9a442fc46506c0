"""Half-duplex voice (``WS /ws/half_duplex/{session_id}``): spec/half-duplex.md."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from omnilive.protocol.common import Float32Base64, SafeId, VoiceBase64

_MODEL = ConfigDict(extra="ignore", frozen=True)


class VadSettings(BaseModel):
    model_config = _MODEL
    threshold: float = Field(0.8, ge=0.2, le=0.99)
    min_speech_duration_ms: int = Field(128, ge=0, le=10_000)
    min_silence_duration_ms: int = Field(800, ge=100, le=10_000)
    speech_pad_ms: int = Field(30, ge=0, le=1_000)


class HalfDuplexGeneration(BaseModel):
    model_config = _MODEL
    max_new_tokens: int = Field(256, ge=1, le=4096)
    do_sample: bool = True  # False: greedy decoding
    length_penalty: float = Field(1.1, gt=0, le=10)
    temperature: float = Field(0.7, ge=0, le=2)
    top_p: float = Field(0.8, gt=0, le=1)


class HalfDuplexTts(BaseModel):
    model_config = _MODEL
    enabled: bool = True
    voice: str | None = None
    language: str | None = None


class SessionSettings(BaseModel):
    model_config = _MODEL
    timeout_s: float = Field(180.0, gt=0)


class HalfDuplexConfig(BaseModel):
    model_config = _MODEL
    vad: VadSettings = Field(default_factory=VadSettings)
    generation: HalfDuplexGeneration = Field(default_factory=HalfDuplexGeneration)
    tts: HalfDuplexTts = Field(default_factory=HalfDuplexTts)
    session: SessionSettings = Field(default_factory=SessionSettings)
    # omnilive's extension: speech heard while the model answers interrupts
    # it. For clients whose microphone hears the user, not the answer (echo
    # cancellation, as over WebRTC, or headphones).
    barge_in: bool = False


class SystemText(BaseModel):
    model_config = _MODEL
    type: Literal["text"]
    text: str


class SystemAudio(BaseModel):
    model_config = _MODEL
    type: Literal["audio"]
    data: Float32Base64


SystemItem = Annotated[SystemText | SystemAudio, Field(discriminator="type")]


class Prepare(BaseModel):
    model_config = _MODEL
    type: Literal["prepare"]
    system_prompt: str | None = None
    system_content: list[SystemItem] | None = None
    config: HalfDuplexConfig = Field(default_factory=HalfDuplexConfig)
    ref_audio_base64: VoiceBase64 | None = None  # a WAV file or raw float32 PCM
    # A stored voice; ``ref_audio_base64`` wins over it, and it over system audio.
    ref_audio_id: SafeId | None = None
    recording: bool = True


class ChunkFields(BaseModel):
    """An ``audio_chunk``'s fields beside its audio: what the worker reads
    of the binary form the gateway sends it in (``protocol/media_frame.py``)."""

    model_config = _MODEL
    type: Literal["audio_chunk"]


class AudioChunk(ChunkFields):
    """The client's microphone audio (float32 PCM at 16 kHz, base64), of any length."""

    audio_base64: Float32Base64


class Stop(BaseModel):
    model_config = _MODEL
    type: Literal["stop"]


class Playback(BaseModel):
    """How much of an answer the client played: when it stopped early (the
    user interrupted), the model's context keeps only the heard part
    (docs/resume.md)."""

    model_config = _MODEL
    type: Literal["playback"]
    turn_index: int = Field(ge=0)
    played_ms: float = Field(ge=0)


ClientMessage = Annotated[Prepare | AudioChunk | Stop | Playback, Field(discriminator="type")]
CLIENT_TYPES = ("prepare", "audio_chunk", "stop", "playback")
client_message = TypeAdapter(ClientMessage)


def prepared_message(
    session_id: str,
    timeout_s: float,
    recording_id: str | None,
    warnings: list[str] | None = None,
) -> dict:
    return {
        "type": "prepared",
        "session_id": session_id,
        "timeout_s": timeout_s,
        "recording_session_id": recording_id,
        "warnings": warnings or [],
    }


def vad_state_message(speaking: bool) -> dict[str, Any]:
    return {"type": "vad_state", "speaking": speaking}


def generating_message(speech_duration_ms: float) -> dict[str, Any]:
    return {"type": "generating", "speech_duration_ms": round(speech_duration_ms)}


def interrupted_message(turn_index: int) -> dict[str, Any]:
    """The user spoke over the answer (``barge_in``): it stops here; what
    was sent of it stays in the context until a ``playback`` report cuts it."""
    return {"type": "interrupted", "turn_index": turn_index}


def turn_done_message(turn_index: int, text: str) -> dict[str, Any]:
    return {"type": "turn_done", "turn_index": turn_index, "text": text}


def playback_applied_message(
    turn_index: int, played_ms: float, heard_text: str, cut: bool
) -> dict[str, Any]:
    """The answer to ``playback``: what the context now holds of that answer
    (``context``: ``cut`` to the heard text, or ``unchanged``: all of it was
    heard, or the engine cannot roll its context back)."""
    return {
        "type": "playback_applied",
        "turn_index": turn_index,
        "played_ms": round(played_ms),
        "heard_text": heard_text,
        "context": "cut" if cut else "unchanged",
    }


def timeout_message(elapsed_s: float) -> dict[str, Any]:
    return {"type": "timeout", "elapsed_s": round(elapsed_s, 1)}


STOPPED: dict[str, Any] = {"type": "stopped"}

"""Turn-based chat (``WS /ws/chat``, ``POST /api/chat``): spec/chat.md."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from omnilive.protocol.common import (
    Base64Str,
    Float32Base64,
    SafeId,
    VoiceBase64,
    decoded_length,
)

_MODEL = ConfigDict(extra="ignore", frozen=True)


class TextItem(BaseModel):
    model_config = _MODEL
    type: Literal["text"]
    text: str


class ImageItem(BaseModel):
    model_config = _MODEL
    type: Literal["image"]
    data: Base64Str


class AudioItem(BaseModel):
    model_config = _MODEL
    type: Literal["audio"]
    data: Float32Base64
    sample_rate: int = Field(16000, ge=8000, le=48000)

    @property
    def seconds(self) -> float:
        return decoded_length(self.data) / 4 / self.sample_rate


class VideoItem(BaseModel):
    model_config = _MODEL
    type: Literal["video"]
    data: Base64Str
    stack_frames: int = Field(1, ge=1, le=16)


ContentItem = Annotated[TextItem | ImageItem | AudioItem | VideoItem, Field(discriminator="type")]


class Message(BaseModel):
    model_config = _MODEL
    role: Literal["system", "user", "assistant"]
    content: str | list[ContentItem]

    def items(self) -> list[TextItem | ImageItem | AudioItem | VideoItem]:
        if isinstance(self.content, str):
            return [TextItem(type="text", text=self.content)]
        return list(self.content)


class GenerationConfig(BaseModel):
    model_config = _MODEL
    max_new_tokens: int = Field(512, ge=1, le=8192)
    do_sample: bool = True  # False: greedy decoding, as in the reference
    temperature: float = Field(0.7, ge=0.0, le=2.0)
    top_p: float = Field(0.8, gt=0.0, le=1.0)
    length_penalty: float = Field(1.0, gt=0.0, le=10.0)


class TTSConfig(BaseModel):
    model_config = _MODEL
    enabled: bool = True
    mode: Literal["default", "audio_assistant", "omni", "audio_roleplay", "voice_cloning"] = (
        "default"
    )
    # Accepted for wire compatibility, never used: a client must not name server files.
    ref_audio_path: str | None = None
    ref_audio_data: VoiceBase64 | None = None  # a WAV file or raw float32 PCM
    # A stored voice (``POST /api/assets/ref_audio``); ``ref_audio_data`` wins over it.
    ref_audio_id: SafeId | None = None
    language: str | None = None
    voice: str | None = None


class ImageConfig(BaseModel):
    model_config = _MODEL
    max_slice_nums: int | None = Field(None, ge=1, le=64)
    use_image_id: bool = True


class ChatRequest(BaseModel):
    """The single message a chat client sends."""

    model_config = _MODEL
    messages: list[Message] = Field(min_length=1)
    streaming: bool = True
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    tts: TTSConfig = Field(default_factory=TTSConfig)
    image: ImageConfig = Field(default_factory=ImageConfig)
    omni_mode: bool = False
    enable_thinking: bool = False
    # The client may opt this request out of session recording.
    recording: bool = True

    def modalities(self) -> set[str]:
        return {item.type for m in self.messages for item in m.items()}

    def audio_seconds(self) -> float:
        return sum(i.seconds for m in self.messages for i in m.items() if isinstance(i, AudioItem))


def chunk_message(text_delta: str, audio_data: str | None) -> dict[str, Any]:
    return {"type": "chunk", "text_delta": text_delta, "audio_data": audio_data}


def prefill_done_message(input_tokens: int) -> dict[str, Any]:
    return {"type": "prefill_done", "input_tokens": input_tokens}


def done_message(
    text: str,
    generated_tokens: int,
    input_tokens: int,
    audio_data: str | None,
    recording_session_id: str | None,
    timings: dict[str, float],
    warnings: list[str] | None = None,
) -> dict[str, Any]:
    return {
        "type": "done",
        "text": text,
        "generated_tokens": generated_tokens,
        "input_tokens": input_tokens,
        "audio_data": audio_data,
        "recording_session_id": recording_session_id,
        "timings": timings,
        "warnings": warnings or [],
    }

"""Turn validated wire requests into the engine's decoded types."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from omnilive.audio import (
    INPUT_RATE,
    AudioDecodeError,
    decode_b64,
    pcm_from_b64,
    resample,
    voice_from_b64,
)
from omnilive.engines.messages import (
    AudioPart,
    ChatMessage,
    ChatOptions,
    GenerationOptions,
    ImagePart,
    Part,
    TextPart,
    VideoPart,
    Voice,
)
from omnilive.protocol.chat import AudioItem, ChatRequest, ImageItem, TextItem, VideoItem
from omnilive.voices.store import UnknownVoice, VoiceStore

MAX_IMAGE_PIXELS = 50_000_000
"""The most pixels an image or frame may have (an 8K picture has 33 million).
A small file can declare a huge canvas (a "decompression bomb": 109 kB of PNG
for 30000 x 30000 pixels, 2.7 GB decoded); it is the client's bad input,
refused from its header before anything is decoded."""


class DecodeError(ValueError):
    """Content that passed the gateway's checks but cannot be decoded
    (the client's bad input: ``invalid_request``)."""


def check_image(data: bytes, what: str = "image") -> bytes:
    """Confirm the bytes are an image PIL can read (JPEG, PNG, WebP, ...)
    of at most :data:`MAX_IMAGE_PIXELS`."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            width, height = img.size
            if width * height > MAX_IMAGE_PIXELS:
                raise DecodeError(
                    f"{what} of {width}x{height} pixels exceeds the limit of "
                    f"{MAX_IMAGE_PIXELS:,} pixels"
                )
            img.verify()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        # PIL's own guard, at twice (error) or once (warning) its limit, fires
        # while the header is read: far above ours, so the same refusal.
        raise DecodeError(f"{what} exceeds the limit of {MAX_IMAGE_PIXELS:,} pixels") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        if isinstance(exc, DecodeError):
            raise
        raise DecodeError(f"{what} is not a decodable image: {exc}") from None
    return data


def decode_item(item: TextItem | ImageItem | AudioItem | VideoItem) -> Part:
    try:
        if isinstance(item, TextItem):
            return TextPart(item.text)
        if isinstance(item, ImageItem):
            return ImagePart(check_image(decode_b64(item.data)))
        if isinstance(item, AudioItem):
            pcm = pcm_from_b64(item.data)
            return AudioPart(resample(pcm, item.sample_rate, INPUT_RATE))
        return VideoPart(decode_b64(item.data), item.stack_frames)
    except AudioDecodeError as exc:
        raise DecodeError(f"{item.type} content: {exc}") from None


def load_stored_voice(data_dir: Path | None, voice_id: str) -> np.ndarray:
    """A stored reference voice (16 kHz float32) by id. Blocking (file I/O)."""
    if data_dir is None:
        raise DecodeError("stored voices are not available here")
    try:
        return VoiceStore(data_dir).load(voice_id)
    except UnknownVoice as exc:
        raise DecodeError(f"unknown reference voice: {exc}") from None


def decode_voice(
    ref_audio_b64: str | None,
    name: str | None,
    language: str | None,
    voice_id: str | None = None,
    data_dir: Path | None = None,
) -> Voice | None:
    """The request's voice: its audio, else the stored voice it names, else a name."""
    if ref_audio_b64:
        try:
            return Voice(reference=voice_from_b64(ref_audio_b64), name=name, language=language)
        except AudioDecodeError as exc:
            raise DecodeError(f"reference audio: {exc}") from None
    if voice_id:
        reference = load_stored_voice(data_dir, voice_id)
        return Voice(reference=reference, name=name, language=language)
    if name or language:
        return Voice(name=name, language=language)
    return None


def decode_chat(
    request: ChatRequest, data_dir: Path | None = None
) -> tuple[list[ChatMessage], ChatOptions]:
    """Blocking: decodes media and reads a stored voice (``data_dir``) if one is named."""
    messages = [
        ChatMessage(m.role, tuple(decode_item(item) for item in m.items()))
        for m in request.messages
    ]
    g = request.generation
    options = ChatOptions(
        generation=GenerationOptions(
            max_new_tokens=g.max_new_tokens,
            do_sample=g.do_sample,
            temperature=g.temperature,
            top_p=g.top_p,
            length_penalty=g.length_penalty,
            enable_thinking=request.enable_thinking,
        ),
        tts_enabled=request.tts.enabled,
        tts_mode=request.tts.mode,
        voice=decode_voice(
            request.tts.ref_audio_data,
            request.tts.voice,
            request.tts.language,
            request.tts.ref_audio_id,
            data_dir,
        ),
        max_slice_nums=request.image.max_slice_nums,
        use_image_id=request.image.use_image_id,
        omni_mode=request.omni_mode,
    )
    return messages, options

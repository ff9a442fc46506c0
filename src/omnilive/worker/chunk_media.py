"""An ``audio_chunk`` as the session runners (duplex, half-duplex) take it,
in either of the forms the gateway sends: the client's JSON text, its media
base64, or one binary media frame (``protocol/media_frame.py``), its media
bytes the gateway decoded.

A frame is read at once (:func:`read_frame`); a chunk's media is checked
only when the chunk is handled (:func:`chunk_audio`, :func:`chunk_frames`),
as it always was, so a refusal comes at the same point of the session, with
the same code and words, whichever form the chunk came in: the gateway sends
a chunk whose base64 does not decode as text, and the checks on the bytes
(whole float32 samples, all finite; the frames' count and sizes) are the
same functions for both forms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np
from pydantic import BaseModel, TypeAdapter, ValidationError

from omnilive.audio import AudioDecodeError, decode_b64, pcm_from_b64, pcm_from_bytes
from omnilive.config import LimitSettings
from omnilive.protocol import duplex, half_duplex
from omnilive.protocol.common import (
    ErrorCode,
    ProtocolError,
    decode_client_message,
    describe_validation_error,
)
from omnilive.protocol.media_frame import MediaFrameError, decode_media, is_media_frame

F = TypeVar("F", bound=BaseModel)


@dataclass(frozen=True)
class DecodedChunk(Generic[F]):
    """An ``audio_chunk`` that came as a media frame: its other fields typed
    (the protocol's ``ChunkFields``), its media as the gateway decoded it."""

    fields: F
    audio: bytes  # float32 little-endian PCM, 16 kHz, unchecked
    frames: tuple[bytes, ...] = ()  # JPEG, unchecked


def read_frame(
    raw: str | bytes,
    adapter: TypeAdapter[Any],
    known_types: tuple[str, ...],
    max_bytes: int,
    fields: type[F],
) -> Any:
    """One frame of a session socket: a media frame as a :class:`DecodedChunk`
    (its header validated as ``fields``), any other as the protocol's typed
    message. Raises :class:`ProtocolError`: ``invalid_request`` for a media
    frame that is not one (the gateway's bug, told to the client as any
    refusal is) or whose fields are not the protocol's, else what
    ``decode_client_message`` raises."""
    if not is_media_frame(raw):
        return decode_client_message(raw, adapter, known_types, max_bytes)
    assert isinstance(raw, bytes)
    try:
        media = decode_media(raw)
    except MediaFrameError as exc:
        raise ProtocolError(ErrorCode.INVALID_REQUEST, f"media frame: {exc}") from None
    try:
        typed = fields.model_validate(media.fields)
    except ValidationError as exc:
        raise ProtocolError(ErrorCode.INVALID_REQUEST, describe_validation_error(exc)) from None
    return DecodedChunk(typed, media.audio, media.frames or ())


def chunk_audio(
    chunk: duplex.AudioChunk | half_duplex.AudioChunk | DecodedChunk[Any],
) -> np.ndarray:
    """A chunk's samples (float32, 16 kHz), of either form; refused as
    ``invalid_request`` naming ``audio_base64``."""
    try:
        if isinstance(chunk, DecodedChunk):
            return pcm_from_bytes(chunk.audio)
        return pcm_from_b64(chunk.audio_base64)
    except AudioDecodeError as exc:
        raise ProtocolError(ErrorCode.INVALID_REQUEST, f"audio_base64: {exc}") from None


def chunk_frames(
    chunk: duplex.AudioChunk | DecodedChunk[Any], limits: LimitSettings
) -> list[bytes]:
    """A duplex chunk's frames as bytes, of either form, within ``limits``
    (what they hold is checked apart, off the event loop)."""
    given: Sequence[str | bytes]
    given = chunk.frames if isinstance(chunk, DecodedChunk) else chunk.frame_base64_list or []
    if len(given) > limits.max_frames_per_chunk:
        raise ProtocolError(
            ErrorCode.PAYLOAD_TOO_LARGE,
            f"{len(given)} frames exceed {limits.max_frames_per_chunk} per chunk",
        )
    frames = []
    for number, data in enumerate(given):
        try:
            raw = data if isinstance(data, bytes) else decode_b64(data)
        except AudioDecodeError as exc:
            raise ProtocolError(ErrorCode.INVALID_REQUEST, f"frame {number}: {exc}") from None
        if len(raw) > limits.max_frame_bytes:
            raise ProtocolError(
                ErrorCode.PAYLOAD_TOO_LARGE,
                f"frame {number} of {len(raw)} bytes exceeds {limits.max_frame_bytes}",
            )
        frames.append(raw)
    return frames

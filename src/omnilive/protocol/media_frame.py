"""The binary form of an ``audio_chunk`` on the gateway → worker session socket.

The gateway validates every client message; an ``audio_chunk`` of the duplex
or half-duplex protocol whose media it could decode goes to the worker as one
binary WebSocket frame instead of the client's JSON text, so that the
worker's event loop (the GPU's, where every session's chunks arrive) neither
parses a large JSON string nor decodes base64: the gateway, a process of its
own, has done both. The frame::

    MAGIC           4 bytes, 00 4F 4D 01 (NUL, "OM", version 1)
    header length   4 bytes, unsigned, big-endian
    header          a UTF-8 JSON object: the message's other fields, each media
                    field replaced by its byte length ("audio_base64": 64000,
                    "frame_base64_list": [31211]; the list absent if the
                    message had none)
    media           the audio's bytes, then each frame's, back to back

The bytes are the media as the worker takes them: the audio as the wire's
little-endian float32 PCM at 16 kHz, each frame as the client's JPEG. What
they hold is the worker's to check, as it checks a text message's (so its
refusals read the same either way); this form only carries them.

No JSON text starts with a NUL followed by "O" (in any of the encodings a
JSON decoder detects), so a binary frame that starts otherwise is a client's
message, relayed as it came: the worker reads both forms.

Sans I/O: :func:`media_message` (a validated client message in this form),
:func:`encode_media` and :func:`decode_media`. Every byte string
:func:`encode_media` makes decodes to the message it was made from; any other
is refused with :class:`MediaFrameError`, whose message is one of:

- ``not a media frame``: it does not start with :data:`MAGIC`;
- ``truncated: ...``: shorter than its header length says;
- ``header of N bytes exceeds ...``: over :data:`MAX_HEADER_BYTES`;
- ``header: ...``: not UTF-8, not JSON (as the one client-JSON decoder,
  ``protocol.common.load_json``, refuses it), or not an object;
- ``header has no type``: ``type`` missing or not a string;
- ``audio_base64 ...`` / ``frame_base64_list ...``: a length that is not a
  whole number of bytes (a list of them for the frames);
- ``the header counts N bytes of media, the frame carries M``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from omnilive.audio import AudioDecodeError, decode_b64
from omnilive.protocol.common import ProtocolError, load_json

MAGIC = b"\x00OM\x01"
AUDIO_FIELD = "audio_base64"
FRAMES_FIELD = "frame_base64_list"
MEDIA_FIELDS = (AUDIO_FIELD, FRAMES_FIELD)
MAX_HEADER_BYTES = 64 * 1024  # a chunk's own fields are a few dozen bytes
_PREFIX = len(MAGIC) + 4


class MediaFrameError(ValueError):
    """A byte string that is not a media frame (the reasons: the module's)."""


@dataclass(frozen=True)
class MediaMessage:
    """A message whose media travels as bytes."""

    fields: dict[str, Any]  # every field but the media, ``type`` among them
    audio: bytes  # what ``audio_base64`` decodes to
    frames: tuple[bytes, ...] | None = None  # what ``frame_base64_list`` does; None: absent

    @property
    def type(self) -> str:
        return str(self.fields["type"])


def is_media_frame(raw: str | bytes) -> bool:
    """Whether a frame of the session socket is in this form (else it is a
    client's message as the client sent it)."""
    return isinstance(raw, bytes) and raw.startswith(MAGIC)


def encode_media(message: MediaMessage) -> bytes:
    """One media frame: ``message.fields`` (JSON-serializable, a string
    ``type`` among them, no media field) with its audio and frames."""
    fields = message.fields
    if not isinstance(fields.get("type"), str):
        raise ValueError("fields need a string type")
    if any(name in fields for name in MEDIA_FIELDS):
        raise ValueError(f"fields carry a media field; pass it as bytes: {MEDIA_FIELDS}")
    header: dict[str, Any] = {**fields, AUDIO_FIELD: len(message.audio)}
    if message.frames is not None:
        header[FRAMES_FIELD] = [len(frame) for frame in message.frames]
    text = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
    if len(text) > MAX_HEADER_BYTES:
        raise ValueError(f"header of {len(text)} bytes exceeds {MAX_HEADER_BYTES}")
    size = len(text).to_bytes(4, "big")
    return b"".join([MAGIC, size, text, message.audio, *(message.frames or ())])


def media_message(message: BaseModel) -> MediaMessage | None:
    """A validated client message in this form: an ``audio_chunk`` with its
    base64 decoded (as strictly as the worker decodes it). None for any other
    message, and for one whose base64 does not decode: that one goes on as
    the client sent it, and the worker refuses it as it always has (the same
    error, at the same point of the session)."""
    if getattr(message, "type", None) != "audio_chunk" or not hasattr(message, AUDIO_FIELD):
        return None
    encoded = getattr(message, FRAMES_FIELD, None)
    try:
        audio = decode_b64(getattr(message, AUDIO_FIELD))
        frames = None if encoded is None else tuple(decode_b64(frame) for frame in encoded)
    except AudioDecodeError:
        return None
    fields = message.model_dump(mode="json", exclude=set(MEDIA_FIELDS), exclude_defaults=True)
    return MediaMessage(fields, audio, frames)


def decode_media(raw: bytes) -> MediaMessage:
    """The message of one media frame; :class:`MediaFrameError` for any
    byte string that is not one."""
    if not raw.startswith(MAGIC):
        raise MediaFrameError("not a media frame")
    if len(raw) < _PREFIX:
        raise MediaFrameError(f"truncated: {len(raw)} bytes, the prefix takes {_PREFIX}")
    size = int.from_bytes(raw[len(MAGIC) : _PREFIX], "big")
    if size > MAX_HEADER_BYTES:
        raise MediaFrameError(f"header of {size} bytes exceeds {MAX_HEADER_BYTES}")
    media_at = _PREFIX + size
    if len(raw) < media_at:
        raise MediaFrameError(f"truncated: {len(raw)} bytes, the header ends at {media_at}")
    fields = _header(raw[_PREFIX:media_at])
    audio_size = _length(fields.pop(AUDIO_FIELD, None), AUDIO_FIELD)
    frame_sizes = fields.pop(FRAMES_FIELD, None)
    if frame_sizes is not None:
        if not isinstance(frame_sizes, list):
            raise MediaFrameError(f"{FRAMES_FIELD} must be a list of byte lengths")
        frame_sizes = [_length(size, FRAMES_FIELD) for size in frame_sizes]
    counted = audio_size + sum(frame_sizes or ())
    if counted != len(raw) - media_at:
        raise MediaFrameError(
            f"the header counts {counted} bytes of media, the frame carries {len(raw) - media_at}"
        )
    at = media_at + audio_size
    audio = raw[media_at:at]
    if frame_sizes is None:
        return MediaMessage(fields, audio)
    frames = []
    for size in frame_sizes:
        frames.append(raw[at : at + size])
        at += size
    return MediaMessage(fields, audio, tuple(frames))


def _header(text: bytes) -> dict[str, Any]:
    try:
        value = load_json(text.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise MediaFrameError(f"header: not UTF-8: {exc}") from None
    except ProtocolError as exc:
        raise MediaFrameError(f"header: {exc.message}") from None
    if not isinstance(value, dict):
        raise MediaFrameError("header: not a JSON object")
    if not isinstance(value.get("type"), str):
        raise MediaFrameError("header has no type")
    return value


def _length(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MediaFrameError(f"{field} must be a byte length (an integer of at least 0)")
    return value

"""The channel between the gateway and one of its media processes, without
I/O: typed messages, each framed as a 4-byte big-endian length and its JSON.

The channel carries signalling only (an offer in, its answer or refusal
out, hang-ups, calls gone); a call's session travels on a WebSocket of its
own, from the media process to the gateway's route (``docs/webrtc.md``).
:class:`Decoder` takes bytes as they come and hands out whole messages; a
frame over :data:`MAX_FRAME_BYTES`, or one that is not a known message, is a
:class:`WireError` (the channel is then closed: the peer is broken).
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, field
from typing import Annotated, Literal

from pydantic import Field, TypeAdapter, ValidationError

# An offer is at most 64 KiB (offer.py), and so is what comes with it.
MAX_FRAME_BYTES = 1024 * 1024
_LENGTH = struct.Struct(">I")


class WireError(Exception):
    """Bytes on the channel that are no message of it."""


@dataclass(frozen=True)
class Hello:
    """media → gateway, once: the process imported aiortc and takes calls."""

    pid: int
    type: Literal["hello"] = "hello"


@dataclass(frozen=True)
class OpenCall:
    """gateway → media: answer ``sdp`` and run the call's session on the
    gateway's WebSocket route ``path?query``, opened with ``credential``
    (a one-time pass for the caller, ``gateway/call_passes.py``)."""

    call_id: str
    dialect: str  # a Dialect's value
    sdp: str
    path: str
    query: str
    credential: str
    frame_max_side: int = 640
    media: tuple[str, ...] = ()
    first_events: tuple[str, ...] = ()
    user_agent: str | None = None
    type: Literal["open_call"] = "open_call"


@dataclass(frozen=True)
class Answered:
    """media → gateway: the call's SDP answer; its session began."""

    call_id: str
    sdp: str
    type: Literal["answered"] = "answered"


@dataclass(frozen=True)
class Refused:
    """media → gateway: the call will not run, as an HTTP refusal."""

    call_id: str
    status: int
    code: str
    message: str
    type: Literal["refused"] = "refused"


@dataclass(frozen=True)
class HangUp:
    """gateway → media: end the call (a hang-up, or its offer's client left)."""

    call_id: str
    type: Literal["hang_up"] = "hang_up"


@dataclass(frozen=True)
class Closed:
    """media → gateway: the call's peer connection is closed (it no longer
    counts against ``max_peer_connections``)."""

    call_id: str
    type: Literal["closed"] = "closed"


Message = Hello | OpenCall | Answered | Refused | HangUp | Closed
_MESSAGE: TypeAdapter[Message] = TypeAdapter(Annotated[Message, Field(discriminator="type")])


def encode(message: Message) -> bytes:
    """One frame: the length, then the message's JSON."""
    payload = json.dumps(asdict(message), separators=(",", ":")).encode()
    if len(payload) > MAX_FRAME_BYTES:
        raise WireError(f"a {message.type} message of {len(payload)} bytes is over the frame limit")
    return _LENGTH.pack(len(payload)) + payload


@dataclass
class Decoder:
    """Whole messages out of the bytes of one channel, as they arrive."""

    max_frame_bytes: int = MAX_FRAME_BYTES
    _buffer: bytearray = field(default_factory=bytearray)

    def feed(self, data: bytes) -> list[Message]:
        self._buffer += data
        messages: list[Message] = []
        while len(self._buffer) >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(self._buffer)
            if length > self.max_frame_bytes:
                raise WireError(f"a frame of {length} bytes is over the limit")
            end = _LENGTH.size + length
            if len(self._buffer) < end:
                break
            payload = bytes(self._buffer[_LENGTH.size : end])
            del self._buffer[:end]
            messages.append(decode(payload))
        return messages

    @property
    def pending(self) -> int:
        """Bytes of a frame not yet whole."""
        return len(self._buffer)


def decode(payload: bytes) -> Message:
    """One frame's payload as its message, or :class:`WireError`."""
    try:
        return _MESSAGE.validate_json(payload)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise WireError(f"not a message of the channel: {first['msg']}") from None

"""What a WebRTC call changes in each protocol, without I/O: the microphone's
audio becomes the protocol's own audio message (as a WebSocket client would
send it, so the session path after the transport is the same), and the
audio in server events leaves the events for the Opus track.

Per protocol: the input format and chunk length, which server event carries
output audio (removed from the data channel, as OpenAI's WebRTC does), which
one means the user started talking (the queued answer audio is flushed:
barge-in), and when audio may flow (a half-duplex or duplex session takes
audio only once ``prepared``, and none while paused).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from omnilive.audio import INPUT_RATE, OUTPUT_RATE
from omnilive.protocol.common import ProtocolError, load_json


class Dialect(StrEnum):
    OPENAI = "openai"  # the Realtime API's GA dialect, /v1/realtime/calls
    HALF_DUPLEX = "half_duplex"
    DUPLEX = "duplex"  # audio or omni
    LIVE = "live"  # OpenAI's Live API, POST /v1/live/sessions


@dataclass
class Outbound:
    """One server message split for the two ways out."""

    event: str | None  # the JSON text for the data channel; None: nothing to send
    audio: np.ndarray | None = None  # 24 kHz float32 for the track
    flush: bool = False  # drop the answer audio still queued (the user barged in)


# A Live session takes audio once its session.start is accepted (session.started).
_READY_AT_START = {Dialect.OPENAI: True, Dialect.HALF_DUPLEX: False, Dialect.DUPLEX: False,
                   Dialect.LIVE: False}  # fmt: skip
# Audio per synthesized message: short for the VAD of the conversation paths,
# one model unit (1 s) for duplex, whose every chunk is a unit; Live's runner
# joins its audio into units itself, and its turn VAD wants short pieces.
CHUNK_S = {Dialect.OPENAI: 0.02, Dialect.HALF_DUPLEX: 0.02, Dialect.DUPLEX: 1.0, Dialect.LIVE: 0.1}
# OpenAI's audio/pcm: 24 kHz 16-bit (a Live call's format is that: see
# routes/live.py); omnilive's own: 16 kHz float32.
INPUT_RATES = {Dialect.OPENAI: 24_000, Dialect.HALF_DUPLEX: INPUT_RATE, Dialect.DUPLEX: INPUT_RATE,
               Dialect.LIVE: 24_000}  # fmt: skip
OPENAI_AUDIO_DELTA = "response.output_audio.delta"
LIVE_AUDIO_DELTA = "session.output_audio.delta"
_LIVE_APPEND = "session.input_audio.append"
_AUDIO_TYPES = ("input_audio_buffer.append", "audio_chunk", _LIVE_APPEND)
OUTPUT_AUDIO_RATE = OUTPUT_RATE  # both dialects answer at 24 kHz
# A camera frame's longest side, as the duplex page grabs it over the
# WebSocket: 640 px, or 1280 px for a session that asks for more than one
# slice (the page's HD, max_slice_nums 2): a smaller frame has no detail to slice.
FRAME_MAX_SIDE = 640
HD_FRAME_MAX_SIDE = 1280


@dataclass
class MediaDialect:
    """One call's protocol, as the transport sees it."""

    dialect: Dialect
    ready: bool = field(init=False)
    paused: bool = False
    force_listen: bool = False  # the next duplex chunk asks the model to listen
    audio_chunks: int = 0
    frame_max_side: int = FRAME_MAX_SIDE  # the prepare's max_slice_nums decides

    def __post_init__(self) -> None:
        self.ready = _READY_AT_START[self.dialect]

    @property
    def chunk_s(self) -> float:
        return CHUNK_S[self.dialect]

    @property
    def whole_units(self) -> bool:
        """Every chunk exactly :attr:`chunk_s` long (a duplex unit); else each
        chunk is whatever the last packets made, at most that long."""
        return self.dialect is Dialect.DUPLEX

    @property
    def input_rate(self) -> int:
        return INPUT_RATES[self.dialect]

    @property
    def takes_audio(self) -> bool:
        return self.ready and not self.paused

    def take_slices(self, max_slice_nums: Any) -> None:
        """Frames for a session of ``max_slice_nums``: more than one slice
        wants the larger frame (anything but an int is the session's to refuse)."""
        slices = max_slice_nums if type(max_slice_nums) is int else 1
        self.frame_max_side = HD_FRAME_MAX_SIDE if slices > 1 else FRAME_MAX_SIDE

    def audio_message(self, samples: np.ndarray, frame_jpeg: bytes | None = None) -> str:
        """The protocol's audio message for ``samples`` (mono float32 at
        :attr:`input_rate`), with a camera frame for omni duplex."""
        self.audio_chunks += 1
        if self.dialect in (Dialect.OPENAI, Dialect.LIVE):
            pcm = (np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()
            kind = "input_audio_buffer.append" if self.dialect is Dialect.OPENAI else _LIVE_APPEND
            return json.dumps({"type": kind, "audio": _b64(pcm)})
        raw = np.ascontiguousarray(samples, dtype="<f4").tobytes()
        message: dict[str, Any] = {"type": "audio_chunk", "audio_base64": _b64(raw)}
        if frame_jpeg is not None:
            message["frame_base64_list"] = [_b64(frame_jpeg)]
        if self.force_listen and self.dialect is Dialect.DUPLEX:
            message["force_listen"] = True
            self.force_listen = False
        return json.dumps(message)

    def client_event(self, text: str) -> str | None:
        """A data-channel message on its way to the session; None drops it.
        Audio messages are the track's alone: one sent on the channel would
        be heard twice."""
        message = client_json(text)
        if message is None:
            return text  # the session answers it with its protocol's error
        if isinstance(message, dict) and message.get("type") == "prepare":
            self.take_slices(message.get("max_slice_nums"))
        if isinstance(message, dict) and message.get("type") in _AUDIO_TYPES:
            # A duplex page's "let me talk" rides on an empty audio_chunk:
            # it marks the next chunk the track's audio makes.
            self.force_listen = self.force_listen or message.get("force_listen") is True
            return None
        return text

    def outbound(self, payload: str) -> Outbound:
        """Split one server message (text as the session wrote it)."""
        try:
            message = json.loads(payload)
        except ValueError:
            return Outbound(payload)
        if not isinstance(message, dict):
            return Outbound(payload)
        kind = message.get("type")
        if self.dialect is Dialect.OPENAI:
            if kind == OPENAI_AUDIO_DELTA:
                return Outbound(None, _pcm16(message.get("delta")))
            return Outbound(payload, flush=kind == "input_audio_buffer.speech_started")
        if self.dialect is Dialect.LIVE:  # full duplex: the model itself stops for the user
            if kind == LIVE_AUDIO_DELTA:
                return Outbound(None, _pcm16(message.get("delta")))
            self.ready = self.ready or kind == "session.started"
            return Outbound(payload)
        self._follow(kind, message)
        audio_field = "audio_data" if kind in ("result", "chunk") else None
        if audio_field is None or not message.get(audio_field):
            # The user speaks (a half-duplex barge-in, or the answer still
            # playing out when the next turn starts): what is queued of the
            # answer is not played over them.
            return Outbound(payload, flush=self._barged_in(kind, message))
        audio = _f32(message[audio_field])
        message[audio_field] = None  # the answer plays on the track
        return Outbound(json.dumps(message), audio)

    def _barged_in(self, kind: Any, message: dict[str, Any]) -> bool:
        if self.dialect is not Dialect.HALF_DUPLEX:
            return False
        return kind == "interrupted" or (kind == "vad_state" and message.get("speaking") is True)

    def _follow(self, kind: Any, message: dict[str, Any]) -> None:
        # A call that resumed a session (docs/resume.md) takes over one that
        # is prepared already: its "prepared" went to the lost call.
        if kind in ("prepared", "session.resumed"):
            self.ready = True
        elif kind == "paused":
            self.paused = True
        elif kind == "resumed":
            self.paused = False


def client_json(text: str) -> Any:
    """A data-channel message decoded by the one client-JSON decoder, None
    when it refuses it (the session then answers with its protocol's error).
    Python's own decoder raised RecursionError on deep JSON, inside aiortc's
    message handler, which tore the call down with no error event."""
    try:
        return load_json(text)
    except ProtocolError:
        return None


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _pcm16(data: Any) -> np.ndarray | None:
    if not isinstance(data, str) or not data:
        return None
    raw = base64.b64decode(data)
    return np.frombuffer(raw[: len(raw) // 2 * 2], dtype="<i2").astype(np.float32) / 32768.0


def _f32(data: str) -> np.ndarray | None:
    raw = base64.b64decode(data)
    return np.frombuffer(raw[: len(raw) // 4 * 4], dtype="<f4").astype(np.float32)


class Fragments:
    """A client message too large for one data-channel message (browsers
    send at most 256 KiB; a prepare with a voice is larger) arrives as binary
    fragments: a first byte of 1 when more follow, 0 on the last; the rest is
    the message's UTF-8. Past ``max_bytes`` the message is dropped whole."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._parts: list[bytes] = []
        self._size = 0
        self._oversized = False
        self.dropped = 0

    def add(self, fragment: bytes) -> str | None:
        """The whole message once its last fragment came; else None."""
        if fragment:
            self._size += len(fragment) - 1
            if self._size > self.max_bytes:
                self._oversized = True
                self._parts.clear()
            elif not self._oversized:
                self._parts.append(fragment[1:])
        if fragment[:1] == b"\x01":
            return None
        whole, oversized = b"".join(self._parts), self._oversized
        self._parts, self._size, self._oversized = [], 0, False
        if oversized:
            self.dropped += 1
            return None
        return whole.decode("utf-8", "replace")

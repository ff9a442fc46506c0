"""Limits: per-key request rate and concurrent sessions (pure bookkeeping
with a clock), and what one session message may carry.

The rate is a token bucket per key: a key may burst up to its per-minute
allowance, then goes on at that rate. Sessions are counted while they are
open. Memory is bounded by the number of configured keys (client tokens
count against the key that minted them; an open gateway has no keys and
no limits).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omnilive.config import LimitSettings
from omnilive.gateway.credentials import Principal
from omnilive.protocol.common import ErrorCode, ProtocolError, decoded_length


@dataclass(frozen=True)
class Refusal:
    code: ErrorCode
    message: str
    retry_after_s: int


@dataclass
class _Bucket:
    tokens: float
    updated: float


class KeyLimiter:
    """Decides whether a key may make one more request or open one more session.

    ``None`` limits on a principal mean the defaults; 0 means no limit."""

    def __init__(
        self,
        requests_per_minute: int,
        max_sessions: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.requests_per_minute = requests_per_minute
        self.max_sessions = max_sessions
        self.clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._sessions: dict[str, int] = {}

    def _rate_of(self, principal: Principal) -> int:
        rate = principal.requests_per_minute
        return self.requests_per_minute if rate is None else rate

    def _sessions_of(self, principal: Principal) -> int:
        limit = principal.max_sessions
        return self.max_sessions if limit is None else limit

    def request(self, principal: Principal) -> Refusal | None:
        """Count one request; a refusal when the key is over its rate."""
        rate = self._rate_of(principal)
        if rate <= 0:
            return None
        now = self.clock()
        bucket = self._buckets.get(principal.key_id)
        if bucket is None:
            bucket = self._buckets[principal.key_id] = _Bucket(float(rate), now)
        per_s = rate / 60.0
        bucket.tokens = min(float(rate), bucket.tokens + (now - bucket.updated) * per_s)
        bucket.updated = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return None
        wait = math.ceil((1.0 - bucket.tokens) / per_s)
        message = f"more than {rate} requests per minute for this key"
        return Refusal(ErrorCode.RATE_LIMITED, message, wait)

    def open_session(self, principal: Principal) -> Refusal | None:
        """Take one session place; a refusal when the key holds its maximum."""
        limit = self._sessions_of(principal)
        held = self._sessions.get(principal.key_id, 0)
        if limit > 0 and held >= limit:
            message = f"this key already holds {held} sessions (limit {limit})"
            return Refusal(ErrorCode.TOO_MANY_SESSIONS, message, 5)
        self._sessions[principal.key_id] = held + 1
        return None

    def close_session(self, principal: Principal) -> None:
        held = self._sessions.get(principal.key_id, 0) - 1
        if held > 0:
            self._sessions[principal.key_id] = held
        else:
            self._sessions.pop(principal.key_id, None)

    def sessions_of(self, principal: Principal) -> int:
        return self._sessions.get(principal.key_id, 0)


# --- what one message may carry ------------------------------------------------------

INPUT_RATE = 16_000
FLOAT32_BYTES = 4


def check_message(message: Any, limits: LimitSettings) -> None:
    """Raise :class:`ProtocolError` (``payload_too_large``) when a half-duplex
    or duplex message carries more audio or frames than the limits allow.

    Sizes come from the base64 lengths: a message refused here is never decoded."""
    audio = getattr(message, "audio_base64", None)
    if audio is not None:
        seconds = decoded_length(audio) / FLOAT32_BYTES / INPUT_RATE
        if seconds > limits.max_chunk_audio_s:
            raise ProtocolError(
                ErrorCode.PAYLOAD_TOO_LARGE,
                f"chunk of {seconds:.3f} s exceeds {limits.max_chunk_audio_s:g} s",
            )
    frames = getattr(message, "frame_base64_list", None) or []
    if len(frames) > limits.max_frames_per_chunk:
        raise ProtocolError(
            ErrorCode.PAYLOAD_TOO_LARGE,
            f"{len(frames)} frames exceed {limits.max_frames_per_chunk} per chunk",
        )
    for number, frame in enumerate(frames):
        if decoded_length(frame) > limits.max_frame_bytes:
            raise ProtocolError(
                ErrorCode.PAYLOAD_TOO_LARGE,
                f"frame {number} of {decoded_length(frame)} bytes exceeds {limits.max_frame_bytes}",
            )
    if getattr(message, "type", None) == "prepare":
        fields = ("ref_audio_base64", "tts_ref_audio_base64")
        sizes = [decoded_length(getattr(message, name, None) or "") for name in fields]
        items = getattr(message, "system_content", None) or []
        sizes += [decoded_length(i.data) for i in items if getattr(i, "type", None) == "audio"]
        # Measured as float32 at 16 kHz, whatever the format (WAV is smaller).
        seconds = sum(sizes) / FLOAT32_BYTES / INPUT_RATE
        if seconds > limits.max_prepare_audio_s:
            raise ProtocolError(
                ErrorCode.PAYLOAD_TOO_LARGE,
                f"{seconds:.3f} s of audio in prepare exceed {limits.max_prepare_audio_s:g} s",
            )

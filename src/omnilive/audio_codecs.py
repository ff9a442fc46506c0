"""The OpenAI Realtime API's audio formats, to and from omnilive's own
(float32 mono, 16 kHz in, 24 kHz out): ``audio/pcm`` (16-bit little-endian
at 24 kHz) and G.711 ``audio/pcmu`` (mu-law) and ``audio/pcma`` (A-law) at
8 kHz, per ITU-T G.711, with numpy (``audioop`` is gone from Python 3.13)."""

from __future__ import annotations

import base64
import binascii

import numpy as np

from omnilive.audio import INPUT_RATE, OUTPUT_RATE, AudioDecodeError, resample

PCM_RATE = 24_000
G711_RATE = 8_000
_BIAS = 0x84
_CLIP = 32635


def _rate(fmt: str) -> int:
    return PCM_RATE if fmt == "audio/pcm" else G711_RATE


def decode_input(data: str, fmt: str, rate: int | None = None) -> np.ndarray:
    """Base64 audio of ``fmt`` (at ``rate``, else the format's own) as
    float32 mono at 16 kHz."""
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise AudioDecodeError(f"invalid base64: {exc}") from None
    if fmt == "audio/pcm":
        if len(raw) % 2:
            raise AudioDecodeError("audio/pcm holds whole 16-bit samples")
        samples = np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0
    elif fmt == "audio/pcmu":
        samples = ulaw_decode(np.frombuffer(raw, dtype=np.uint8))
    else:
        samples = alaw_decode(np.frombuffer(raw, dtype=np.uint8))
    return resample(samples, rate or _rate(fmt), INPUT_RATE)


def encode_output(samples: np.ndarray, fmt: str, rate: int | None = None) -> str:
    """float32 mono at 24 kHz as base64 audio of ``fmt`` (at ``rate``, else
    the format's own)."""
    target = rate or _rate(fmt)
    if target != OUTPUT_RATE:
        samples = resample(samples, OUTPUT_RATE, target)
    pcm = (np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2")
    if fmt == "audio/pcmu":
        raw = ulaw_encode(pcm).tobytes()
    elif fmt == "audio/pcma":
        raw = alaw_encode(pcm).tobytes()
    else:
        raw = pcm.tobytes()
    return base64.b64encode(raw).decode("ascii")


def duration_ms(data_b64_len: int, fmt: str) -> float:
    """How long base64 audio of this many characters lasts."""
    n_bytes = data_b64_len * 3 // 4
    per_sample = 2 if fmt == "audio/pcm" else 1
    return n_bytes / per_sample / _rate(fmt) * 1000


def ulaw_decode(codes: np.ndarray) -> np.ndarray:
    u = ~codes.astype(np.int32) & 0xFF
    sign, exponent, mantissa = u & 0x80, (u >> 4) & 0x07, u & 0x0F
    magnitude = (((mantissa << 3) + _BIAS) << exponent) - _BIAS
    return np.where(sign != 0, -magnitude, magnitude).astype(np.float32) / 32768.0


def ulaw_encode(pcm: np.ndarray) -> np.ndarray:
    x = pcm.astype(np.int32)
    sign = np.where(x < 0, 0x80, 0)
    magnitude = np.minimum(np.abs(x), _CLIP) + _BIAS
    exponent = np.clip(np.floor(np.log2(magnitude)).astype(np.int32) - 7, 0, 7)
    mantissa = (magnitude >> (exponent + 3)) & 0x0F
    return (~(sign | (exponent << 4) | mantissa) & 0xFF).astype(np.uint8)


def alaw_decode(codes: np.ndarray) -> np.ndarray:
    a = codes.astype(np.int32) ^ 0x55
    sign, exponent, mantissa = a & 0x80, (a >> 4) & 0x07, a & 0x0F
    magnitude = np.where(
        exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0)
    )
    return np.where(sign != 0, magnitude, -magnitude).astype(np.float32) / 32768.0


def alaw_encode(pcm: np.ndarray) -> np.ndarray:
    x = pcm.astype(np.int32)
    sign = np.where(x >= 0, 0x80, 0)
    magnitude = np.minimum(np.where(x >= 0, x, -x - 1), 32767)
    exponent = np.clip(np.floor(np.log2(np.maximum(magnitude, 1))).astype(np.int32) - 7, 0, 7)
    shift = np.where(exponent == 0, 4, exponent + 3)
    mantissa = (magnitude >> shift) & 0x0F
    return ((sign | (exponent << 4) | mantissa) ^ 0x55).astype(np.uint8)

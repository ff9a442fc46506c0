"""PCM, base64 and WAV helpers shared by every mode.

Wire audio is base64 of raw little-endian float32 mono samples: 16 kHz from
the client, 24 kHz to the client.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import wave
from typing import Any

import numpy as np

INPUT_RATE = 16_000
OUTPUT_RATE = 24_000


class AudioDecodeError(ValueError):
    """Raised for audio a client sent that cannot be decoded."""


def decode_b64(data: str) -> bytes:
    """Strict base64 decoding: any character outside the alphabet is an error."""
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise AudioDecodeError(f"invalid base64: {exc}") from None


def encode_b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def pcm_from_b64(data: str) -> np.ndarray:
    """Decode base64 float32 PCM; the byte count must be a multiple of 4."""
    return pcm_from_bytes(decode_b64(data))


def pcm_from_bytes(raw: bytes) -> np.ndarray:
    """Raw little-endian float32 PCM as samples: whole 4-byte samples, all finite."""
    if len(raw) % 4:
        raise AudioDecodeError(f"float32 PCM needs a multiple of 4 bytes, got {len(raw)}")
    samples = np.frombuffer(raw, dtype="<f4")
    if not np.isfinite(samples).all():
        raise AudioDecodeError("PCM contains NaN or infinite samples")
    return samples.astype(np.float32, copy=False)


def voice_from_b64(data: str) -> np.ndarray:
    """A reference voice as 16 kHz float32: a base64 WAV file (told by its
    ``RIFF`` header, any rate) or base64 raw float32 PCM at 16 kHz."""
    raw = decode_b64(data)
    if raw.startswith(b"RIFF"):
        samples, rate = read_wav(raw)
        return resample(samples, rate, INPUT_RATE)
    return pcm_from_b64(data)


def pcm_to_b64(samples: np.ndarray) -> str:
    return encode_b64(np.ascontiguousarray(samples, dtype="<f4").tobytes())


def resample(samples: np.ndarray, src_rate: int, dst_rate: int) -> np.ndarray:
    """Linear-interpolation resampling; good enough for speech between 16–24 kHz."""
    if src_rate == dst_rate or samples.size == 0:
        return samples.astype(np.float32, copy=False)
    n_out = round(samples.size * dst_rate / src_rate)
    positions = np.linspace(0, samples.size - 1, n_out)
    return np.interp(positions, np.arange(samples.size), samples).astype(np.float32)


def wav_bytes(samples: np.ndarray, rate: int, channels: int = 1) -> bytes:
    """16-bit PCM WAV. ``samples`` is (n,) mono or (n, channels) interleaved."""
    clipped = np.clip(samples, -1.0, 1.0)
    pcm16 = (clipped * 32767.0).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm16.tobytes())
    return buf.getvalue()


def read_wav(data: bytes) -> tuple[np.ndarray, int]:
    """Decode a PCM WAV (8/16/32-bit int) to mono float32 and its rate."""
    try:
        with wave.open(io.BytesIO(data), "rb") as src:
            rate, width, channels = src.getframerate(), src.getsampwidth(), src.getnchannels()
            frames = src.readframes(src.getnframes())
    except (wave.Error, EOFError) as exc:
        raise AudioDecodeError(f"not a PCM WAV file: {exc}") from None
    dtypes: dict[int, np.dtype[Any]] = {
        1: np.dtype(np.uint8),
        2: np.dtype("<i2"),
        4: np.dtype("<i4"),
    }
    if width not in dtypes:
        raise AudioDecodeError(f"unsupported WAV sample width {width}")
    pcm = np.frombuffer(frames, dtype=dtypes[width]).astype(np.float32)
    if width == 1:
        pcm = (pcm - 128.0) / 128.0
    else:
        pcm /= float(2 ** (8 * width - 1))
    if channels > 1:
        pcm = pcm.reshape(-1, channels).mean(axis=1)
    return pcm.astype(np.float32), rate


def tone(duration_s: float, rate: int, freq_hz: float, amplitude: float = 0.2) -> np.ndarray:
    """A sine tone with 10 ms fades, so concatenated tones do not click."""
    n = max(0, round(duration_s * rate))
    t = np.arange(n, dtype=np.float32) / rate
    wave_ = amplitude * np.sin(2 * math.pi * freq_hz * t).astype(np.float32)
    fade = min(n // 2, round(0.01 * rate))
    if fade:
        ramp = np.linspace(0.0, 1.0, fade, dtype=np.float32)
        wave_[:fade] *= ramp
        wave_[-fade:] *= ramp[::-1]
    return wave_


def duration_s(samples: np.ndarray, rate: int) -> float:
    return samples.size / rate


def rms(samples: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(samples)))) if samples.size else 0.0

"""Audio for clients: numpy float32 mono arrays in and out, WAV files, resampling.

Sessions take 16 kHz audio (``INPUT_RATE``) and answer at 24 kHz
(``OUTPUT_RATE``). These helpers read any PCM or float WAV file into that
shape and write answers back out; the wire's base64 encoding is the server's
own (``omnilive.audio``), so both sides agree by construction.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from omnilive.audio import (
    INPUT_RATE,
    OUTPUT_RATE,
    AudioDecodeError,
    pcm_from_b64,
    pcm_to_b64,
    read_wav,
    resample,
    wav_bytes,
)

__all__ = [
    "INPUT_RATE",
    "OUTPUT_RATE",
    "AudioDecodeError",
    "chunks",
    "decode_pcm",
    "encode_pcm",
    "load_wav",
    "read_wav_file",
    "resample",
    "silence",
    "write_wav",
]

_WAVE_FORMAT_IEEE_FLOAT = 3
_WAVE_FORMAT_EXTENSIBLE = 0xFFFE


def _float_wav(data: bytes) -> tuple[np.ndarray, int]:
    """A 32- or 64-bit IEEE float WAV (what sound cards and numpy tools write),
    which the standard library's ``wave`` module refuses."""
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise AudioDecodeError("not a WAV file")
    fmt: tuple[int, int, int, int] | None = None
    position = 12
    while position + 8 <= len(data):
        name = data[position : position + 4]
        (size,) = struct.unpack("<I", data[position + 4 : position + 8])
        body = data[position + 8 : position + 8 + size]
        if name == b"fmt " and len(body) >= 16:
            tag, channels, rate, _, _, bits = struct.unpack("<HHIIHH", body[:16])
            if tag == _WAVE_FORMAT_EXTENSIBLE and len(body) >= 26:
                tag = struct.unpack("<H", body[24:26])[0]
            fmt = (tag, channels, rate, bits)
        elif name == b"data" and fmt is not None:
            tag, channels, rate, bits = fmt
            if tag != _WAVE_FORMAT_IEEE_FLOAT or bits not in (32, 64):
                raise AudioDecodeError(f"unsupported WAV format {tag} with {bits}-bit samples")
            usable = len(body) - len(body) % (bits // 8)
            samples = np.frombuffer(body[:usable], "<f4" if bits == 32 else "<f8")
            if channels > 1:
                samples = samples[: samples.size - samples.size % channels]
                samples = samples.reshape(-1, channels).mean(axis=1)
            return samples.astype(np.float32), rate
        position += 8 + size + size % 2  # chunks are padded to even sizes
    raise AudioDecodeError("WAV file without a format and data chunk")


def read_wav_file(path: str | Path) -> tuple[np.ndarray, int]:
    """A WAV file (8/16/32-bit PCM or float, any channels) as mono float32 and its rate."""
    data = Path(path).read_bytes()
    try:
        return read_wav(data)
    except AudioDecodeError:
        return _float_wav(data)


def load_wav(path: str | Path, rate: int = INPUT_RATE) -> np.ndarray:
    """A WAV file as mono float32 at ``rate`` (16 kHz: what sessions take)."""
    samples, file_rate = read_wav_file(path)
    return resample(samples, file_rate, rate)


def write_wav(path: str | Path, samples: np.ndarray, rate: int = OUTPUT_RATE) -> None:
    """Write mono float32 samples as a 16-bit PCM WAV file (24 kHz: what sessions answer)."""
    Path(path).write_bytes(wav_bytes(np.asarray(samples, dtype=np.float32), rate))


def silence(seconds: float, rate: int = INPUT_RATE) -> np.ndarray:
    return np.zeros(round(seconds * rate), dtype=np.float32)


def chunks(samples: np.ndarray, seconds: float, rate: int = INPUT_RATE) -> Iterator[np.ndarray]:
    """``samples`` in consecutive pieces of ``seconds`` (the last may be shorter)."""
    size = max(1, round(seconds * rate))
    for start in range(0, samples.size, size):
        yield samples[start : start + size]


def encode_pcm(samples: np.ndarray) -> str:
    """Base64 of float32 little-endian PCM, as every protocol sends audio."""
    return pcm_to_b64(np.asarray(samples, dtype=np.float32))


def decode_pcm(data: str) -> np.ndarray:
    """Audio a server sent (base64 float32 PCM) as a float32 array."""
    return pcm_from_b64(data)

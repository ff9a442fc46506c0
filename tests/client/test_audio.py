"""WAV files in and out, float WAVs included, and resampling."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from omnilive.client.audio import (
    AudioDecodeError,
    chunks,
    decode_pcm,
    encode_pcm,
    load_wav,
    read_wav_file,
    write_wav,
)

TONE = (0.5 * np.sin(np.arange(24000) * 2 * np.pi * 440 / 24000)).astype(np.float32)


def float_wav(samples: np.ndarray, rate: int, channels: int = 1) -> bytes:
    data = np.repeat(samples, channels).astype("<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, channels, rate, rate * 4 * channels, 4 * channels, 32)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    body += b"LIST" + struct.pack("<I", 3) + b"abc\x00"  # an odd-sized chunk before the data
    body += b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def test_written_wav_reads_back_at_its_rate(tmp_path: Path):
    write_wav(tmp_path / "a.wav", TONE)
    samples, rate = read_wav_file(tmp_path / "a.wav")
    assert rate == 24000 and np.abs(samples - TONE).max() < 1e-3
    at_16k = load_wav(tmp_path / "a.wav")
    assert at_16k.size == 16000 and at_16k.dtype == np.float32


def test_float_wav_files_read_too(tmp_path: Path):
    (tmp_path / "f.wav").write_bytes(float_wav(TONE, 24000, channels=2))
    samples, rate = read_wav_file(tmp_path / "f.wav")
    assert rate == 24000 and np.array_equal(samples, TONE)
    (tmp_path / "bad.wav").write_bytes(b"RIFF\x04\x00\x00\x00WAVE")
    with pytest.raises(AudioDecodeError):
        read_wav_file(tmp_path / "bad.wav")


def test_wire_encoding_and_chunks():
    assert np.array_equal(decode_pcm(encode_pcm(TONE)), TONE)
    pieces = list(chunks(TONE[:16000], 0.25))
    assert [p.size for p in pieces] == [4000] * 4

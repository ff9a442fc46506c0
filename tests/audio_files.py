"""Audio files in the common upload formats, made on the spot with ffmpeg."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import numpy as np

from omnilive.audio import INPUT_RATE, wav_bytes

# Upload format → the ffmpeg codec arguments that make it.
FORMATS: dict[str, list[str]] = {
    "wav": [],
    "mp3": ["-c:a", "libmp3lame", "-b:a", "64k"],
    "ogg": ["-c:a", "libvorbis"],
    "webm": ["-c:a", "libopus", "-b:a", "32k"],
    "m4a": ["-c:a", "aac", "-b:a", "64k"],
}


def wav_file(samples: np.ndarray, rate: int = INPUT_RATE) -> bytes:
    return wav_bytes(samples, rate)


def encoded(samples: np.ndarray, fmt: str, rate: int = INPUT_RATE) -> bytes:
    """``samples`` (float32 mono at ``rate``) as a file of format ``fmt``."""
    if fmt == "wav":
        return wav_file(samples, rate)
    with tempfile.TemporaryDirectory() as folder:
        source, target = Path(folder) / "in.wav", Path(folder) / f"out.{fmt}"
        source.write_bytes(wav_file(samples, rate))
        subprocess.run(
            ["ffmpeg", "-nostdin", "-loglevel", "error", "-i", str(source),
             *FORMATS[fmt], "-y", str(target)],
            check=True,
        )  # fmt: skip
        return target.read_bytes()

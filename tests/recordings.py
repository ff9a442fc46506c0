"""Helpers for recording tests: synthetic media and reading recordings back."""

from __future__ import annotations

import asyncio
import io
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from PIL import Image

from omnilive.audio import read_wav
from tests.servers import Server


def jpeg(color: tuple[int, int, int], size: tuple[int, int] = (160, 120)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "JPEG", quality=95)
    return buf.getvalue()


def png(color: tuple[int, int, int] = (0, 128, 255)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), color).save(buf, "PNG")
    return buf.getvalue()


def constant(seconds: float, rate: int, value: float) -> np.ndarray:
    """A flat signal: its first and last samples are exact, unlike a tone's."""
    return np.full(round(seconds * rate), value, np.float32)


def wav_seconds(path: Path) -> float:
    samples, rate = read_wav(path.read_bytes())
    return samples.size / rate


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def stereo(path: Path) -> tuple[np.ndarray, int]:
    """A stereo PCM16 WAV as (n, 2) float32 and its rate."""
    import wave

    with wave.open(str(path), "rb") as src:
        assert src.getnchannels() == 2 and src.getsampwidth() == 2
        rate = src.getframerate()
        pcm = np.frombuffer(src.readframes(src.getnframes()), "<i2")
    return pcm.reshape(-1, 2).astype(np.float32) / 32767.0, rate


def ffprobe(path: Path) -> dict[str, Any]:
    ffprobe_bin = shutil.which("ffprobe")
    assert ffprobe_bin, "ffprobe (from ffmpeg) is needed"
    out = subprocess.run(
        [ffprobe_bin, "-v", "error", "-show_entries",
         "stream=codec_type,duration:format=duration", "-of", "json", str(path)],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    return json.loads(out)


def frame_at(path: Path, seconds: float) -> tuple[int, int, int]:
    """The centre pixel of the video frame shown at ``seconds``."""
    ffmpeg_bin = shutil.which("ffmpeg")
    assert ffmpeg_bin
    out = subprocess.run(
        [ffmpeg_bin, "-v", "error", "-ss", f"{seconds:.3f}", "-i", str(path),
         "-frames:v", "1", "-f", "image2pipe", "-vcodec", "png", "-"],
        check=True, capture_output=True,
    ).stdout  # fmt: skip
    with Image.open(io.BytesIO(out)) as img:
        rgb = img.convert("RGB")
        return rgb.getpixel((rgb.width // 2, rgb.height // 2))  # type: ignore[return-value]


def recording_dir(server: Server, recording_id: str) -> Path:
    return server.tmp / "data" / "sessions" / recording_id


async def meta_when(
    server: Server, recording_id: str, status: str, timeout: float = 15
) -> dict[str, Any]:
    """The session's meta once it says ``status`` and its replays are built."""
    async with httpx.AsyncClient() as client, asyncio.timeout(timeout):
        while True:
            response = await client.get(f"{server.http}/api/sessions/{recording_id}")
            if response.status_code == 200:
                meta = response.json()
                if meta["status"] == status and "replays" in meta:
                    return meta
            await asyncio.sleep(0.1)

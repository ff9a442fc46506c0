"""Any common audio file → 16 kHz mono float32, with ffmpeg.

Uploads are untrusted, so ffmpeg only gets the demuxers of the formats we
accept (a playlist or concat file could otherwise make it read other local
files or the network), only the ``file`` protocol, a time limit, and an output
cut just past the longest duration we keep (a small file must not expand into
hours of audio in memory).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from omnilive.audio import INPUT_RATE

FFMPEG = "ffmpeg"
# Demuxer names as ffmpeg spells them: WAV, MP3, Ogg (Vorbis/Opus), WebM and
# Matroska, MP4/M4A/MOV, FLAC, raw AAC.
DEMUXERS = "wav,mp3,ogg,matroska,webm,mov,mp4,m4a,3gp,3g2,mj2,flac,aac"
_STDERR_CHARS = 300


class UndecodableAudio(ValueError):
    """The bytes are not audio in a format we accept."""


class DecoderUnavailable(RuntimeError):
    """ffmpeg is missing on this machine."""


def decode_file(path: Path, max_seconds: float, timeout_s: float) -> np.ndarray:
    """Decode the first audio stream of ``path`` (at most ``max_seconds`` of it).

    Blocking: run it off the event loop.
    """
    if shutil.which(FFMPEG) is None:
        raise DecoderUnavailable(f"{FFMPEG} is not installed (apt-get install ffmpeg)")
    command = [
        FFMPEG, "-nostdin", "-hide_banner", "-loglevel", "error",
        "-format_whitelist", DEMUXERS, "-protocol_whitelist", "file",
        "-i", f"file:{path}", "-vn", "-t", f"{max_seconds:.3f}",
        "-ac", "1", "-ar", str(INPUT_RATE), "-f", "f32le", "pipe:1",
    ]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise UndecodableAudio(f"decoding took longer than {timeout_s:.0f} s") from None
    if done.returncode != 0:
        detail = done.stderr.decode("utf-8", "replace").strip().splitlines()
        reason = detail[-1] if detail else f"ffmpeg exit {done.returncode}"
        # ffmpeg names its input: the server's own path (a temporary file,
        # for an upload) is not the client's to see.
        reason = reason.replace(f"file:{path}", "the file").replace(str(path), "the file")
        raise UndecodableAudio(f"not a decodable audio file ({reason[:_STDERR_CHARS]})")
    samples = np.frombuffer(done.stdout[: len(done.stdout) // 4 * 4], dtype="<f4")
    if samples.size == 0:
        raise UndecodableAudio("the file holds no audio")
    if not np.isfinite(samples).all():
        raise UndecodableAudio("the decoded audio holds invalid samples")
    return samples.astype(np.float32)


def decode_bytes(data: bytes, max_seconds: float, timeout_s: float) -> np.ndarray:
    """:func:`decode_file` for bytes in memory (an upload). Blocking.

    The bytes go through a private temporary file rather than a pipe: MP4/M4A
    often keep their index at the end, which ffmpeg can only reach by seeking.
    """
    with tempfile.TemporaryDirectory(prefix="omnilive-audio-") as folder:
        path = Path(folder) / "upload"
        path.write_bytes(data)
        return decode_file(path, max_seconds, timeout_s)

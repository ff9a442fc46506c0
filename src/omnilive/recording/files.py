"""Where recordings live and how their files are written.

Every file is written to a temporary name in its own directory and renamed
into place, so a reader (or a process killed mid-write) only ever sees a
whole file: the old one or the new one.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

from omnilive.ids import is_safe_id, mint

SESSIONS_DIR = "sessions"
META = "meta.json"
RECORDING = "recording.json"
COMMENT = "comment.txt"
MERGED_WAV = "merged_replay.wav"
MERGED_MP4 = "merged_replay.mp4"
SUBTITLES = "subtitles.vtt"
USER_AUDIO = "user_audio"
USER_FRAMES = "user_frames"
AI_AUDIO = "ai_audio"
USER_IMAGES = "user_images"
USER_VIDEOS = "user_videos"
TEMP_SUFFIX = ".tmp"

# Recording-id prefixes by mode: ids stay unguessable (``ids.mint``), the
# prefix only tells a human what kind of session a link points to.
ID_PREFIX = {
    "chat": "chat",
    "half_duplex": "hd",
    "audio_duplex": "adx",
    "omni_duplex": "odx",
    "realtime": "rtc",
}


def new_recording_id(mode: str) -> str:
    """A fresh, unguessable recording id for a session of ``mode``."""
    return mint(ID_PREFIX.get(mode, "rec"))


def sessions_root(data_dir: Path) -> Path:
    return Path(data_dir) / SESSIONS_DIR


def session_dir(data_dir: Path, recording_id: str) -> Path:
    """The directory of one recording; refuses ids that are not one safe name."""
    if not is_safe_id(recording_id):
        raise ValueError(f"unsafe recording id {recording_id!r}")
    return sessions_root(data_dir) / recording_id


def is_temp(name: str) -> bool:
    return name.startswith(".") and name.endswith(TEMP_SUFFIX)


def _temp_for(path: Path) -> Path:
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}{TEMP_SUFFIX}")


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that no reader sees a partial file.

    No fsync: the rename is atomic against a killed process, which is the
    failure recordings are kept safe from; power loss may lose the newest
    writes of a session, never corrupt older ones.
    """
    temp = _temp_for(path)
    try:
        with open(temp, "wb") as fh:
            fh.write(data)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, document: Any) -> None:
    write_atomic(path, json.dumps(document, ensure_ascii=False, indent=1).encode("utf-8"))


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from disk, or None when missing or unreadable."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def image_extension(data: bytes) -> str:
    """File extension for an encoded image, from its magic bytes."""
    if data.startswith(b"\xff\xd8\xff"):
        return "jpg"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "gif"
    return "bin"


def media_extension(data: bytes) -> str | None:
    """``webm`` / ``mp4`` / ``wav`` from a file's first bytes, else None."""
    if data.startswith(b"\x1a\x45\xdf\xa3"):  # EBML header: WebM / Matroska
        return "webm"
    if data[4:8] == b"ftyp":
        return "mp4"
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "wav"
    return None


def video_extension(data: bytes) -> str:
    return media_extension(data) or "bin"

"""The read side of recordings, for the gateway's session API: finding a
session by id, safe asset paths, comments and browser-side uploads.

Blocking file work: callers on the event loop use ``asyncio.to_thread``.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path, PurePosixPath
from typing import Any

from omnilive.ids import is_safe_id
from omnilive.recording.files import (
    COMMENT,
    META,
    TEMP_SUFFIX,
    media_extension,
    read_json,
    sessions_root,
    write_atomic,
)

UPLOAD_STEM = "frontend_replay"
MAGIC_BYTES = 12  # enough to tell webm / mp4 / wav apart


class NotFound(LookupError):
    """No such session, or a path that is not one of its files."""


def find_session(data_dir: Path, recording_id: str) -> Path:
    """The directory of an existing recording. Unsafe ids, symlinked
    directories and directories without a ``meta.json`` are all "not found"."""
    if not is_safe_id(recording_id):
        raise NotFound(recording_id)
    root = sessions_root(data_dir).resolve()
    directory = root / recording_id
    if (
        directory.is_symlink()
        or directory.resolve().parent != root
        or not (directory / META).is_file()
    ):
        raise NotFound(recording_id)
    return directory


def read_meta(directory: Path) -> dict[str, Any]:
    meta = read_json(directory / META)
    if meta is None:
        raise NotFound(directory.name)
    return meta


def resolve_asset(directory: Path, relative: str) -> Path:
    """A file inside the session directory. Refused: absolute paths, ``..``,
    hidden or temporary names, and anything (a symlink) resolving outside."""
    pure = PurePosixPath(relative)
    if (
        not relative
        or "\\" in relative
        or "\x00" in relative
        or pure.is_absolute()
        or any(part in ("..", ".") or part.startswith(".") for part in pure.parts)
    ):
        raise NotFound(relative)
    root = directory.resolve()
    candidate = (root / pure).resolve()
    if not candidate.is_relative_to(root) or not candidate.is_file():
        raise NotFound(relative)
    return candidate


def read_comment(directory: Path) -> str:
    try:
        return (directory / COMMENT).read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""


def write_comment(directory: Path, text: str) -> None:
    write_atomic(directory / COMMENT, text.encode("utf-8"))


class UploadRejected(Exception):
    """An upload refused with an HTTP status (413 too large, 415 wrong type)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Upload:
    """A browser-side recording streamed to a temporary file, then renamed to
    ``frontend_replay.{webm,mp4,wav}`` once complete and accepted. Every
    method blocks; call them off the event loop."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.size = 0
        self.extension: str | None = None
        self._head = b""
        self._temp = directory / f".upload.{secrets.token_hex(4)}{TEMP_SUFFIX}"
        self._file = open(self._temp, "wb")  # noqa: SIM115 - closed in commit/abort

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.max_bytes:
            raise UploadRejected(413, f"upload exceeds {self.max_bytes} bytes")
        if self.extension is None:
            self._head += chunk[: MAGIC_BYTES - len(self._head)]
            if len(self._head) >= MAGIC_BYTES:
                self._check_type()
        self._file.write(chunk)

    def _check_type(self) -> None:
        self.extension = media_extension(self._head)
        if self.extension is None:
            raise UploadRejected(415, "upload must be webm, mp4 or wav")

    def commit(self) -> str:
        """Close and move into place; returns the file name."""
        if self.extension is None:
            self._check_type()
        self._file.close()
        name = f"{UPLOAD_STEM}.{self.extension}"
        for stale in self.directory.glob(f"{UPLOAD_STEM}.*"):
            if stale.name != name:  # one browser-side recording per session
                stale.unlink(missing_ok=True)
        os.replace(self._temp, self.directory / name)
        return name

    def abort(self) -> None:
        self._file.close()
        self._temp.unlink(missing_ok=True)

"""A session directory as a zip, produced piece by piece for streaming: the
archive is never whole in memory, only the current piece of one file."""

from __future__ import annotations

import os
import stat
import zipfile
from collections.abc import Iterator
from pathlib import Path

from omnilive.recording.files import is_temp

PIECE_BYTES = 256 * 1024


class _Pipe:
    """A write-only, unseekable stream: ``zipfile`` then writes sizes and
    CRCs after each entry (data descriptors) instead of seeking back."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        return None

    def take(self) -> bytes:
        data = b"".join(self._parts)
        self._parts.clear()
        return data


def session_files(directory: Path) -> list[tuple[str, Path]]:
    """Regular files of a session (no symlinks, no temporaries), sorted."""
    found = []
    for folder, dirs, files in os.walk(directory, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            path = Path(folder) / name
            if name.startswith(".") or is_temp(name):
                continue
            if stat.S_ISREG(path.lstat().st_mode):
                found.append((path.relative_to(directory).as_posix(), path))
    return found


def iter_zip(directory: Path, prefix: str | None = None) -> Iterator[bytes]:
    """The zip of ``directory`` (entries under ``prefix/``), in pieces.
    Blocking: Starlette runs a sync iterator on its thread pool."""
    pipe = _Pipe()
    prefix = prefix or directory.name
    # A write-only pipe: zipfile needs only its write(), flush() and tell().
    with zipfile.ZipFile(pipe, "w", compression=zipfile.ZIP_STORED) as archive:  # type: ignore[call-overload]  # _Pipe has no close(); zipfile never calls it
        for relative, path in session_files(directory):
            try:
                source = open(path, "rb")  # noqa: SIM115 - closed below
            except FileNotFoundError:
                continue  # deleted meanwhile (a replay being rebuilt)
            with source:
                info = zipfile.ZipInfo.from_file(path, f"{prefix}/{relative}")
                info.compress_type = zipfile.ZIP_STORED
                with archive.open(info, "w") as entry:
                    while piece := source.read(PIECE_BYTES):
                        entry.write(piece)
                        if data := pipe.take():
                            yield data
            if data := pipe.take():
                yield data
    if data := pipe.take():
        yield data

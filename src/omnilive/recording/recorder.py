"""The recorder a session runner feeds: typed calls on the event loop, all
disk work on the recorder's writer thread.

A runner opens one recorder per session (``TurnRecorder.open`` /
``DuplexRecorder.open``; None when recording is off or the client opted
out), calls :meth:`TurnRecorder.turn` or :meth:`DuplexRecorder.unit` as the
session goes, and :meth:`Recorder.close` when it ends, also when it is
cancelled. Audio is decoded float32 (user 16 kHz, AI 24 kHz), frames and
media are encoded bytes; the recorder keeps references, so callers must not
mutate arrays they handed over. Times are epoch seconds (``time.time()``).

On disk (``data_dir/sessions/{recording_id}/``): ``meta.json`` says
``status: active`` from the first moment and ``ended`` (or ``abnormal``) at
the end; ``recording.json`` is rewritten, atomically, after every batch of
turns or units, so it is valid JSON at every instant.
"""

from __future__ import annotations

import asyncio
import threading
import time
from enum import StrEnum
from pathlib import Path
from typing import Any, Self

from omnilive.audio import OUTPUT_RATE
from omnilive.clock import iso
from omnilive.config import Settings
from omnilive.recording.files import (
    AI_AUDIO,
    META,
    RECORDING,
    USER_AUDIO,
    USER_FRAMES,
    USER_IMAGES,
    USER_VIDEOS,
    session_dir,
    write_atomic,
    write_json_atomic,
)
from omnilive.recording.replay import build_replays
from omnilive.recording.writer import Writer

SUBDIRS = (USER_AUDIO, USER_FRAMES, AI_AUDIO, USER_IMAGES, USER_VIDEOS)


class Status(StrEnum):
    ACTIVE = "active"
    ENDED = "ended"
    ABNORMAL = "abnormal"


class Recorder:
    """One session's recording. Subclasses add the mode's typed calls; all
    state below is touched only by the writer thread after construction."""

    entries_key = "entries"

    @classmethod
    def open(
        cls,
        settings: Settings,
        mode: str,
        recording_id: str,
        *,
        worker_id: str,
        config: dict[str, Any],
        opted_in: bool = True,
        title: str = "",
        extra_meta: dict[str, Any] | None = None,
    ) -> Self | None:
        """A recorder for one session, or None when recording is switched off
        or the client opted out (then nothing is written)."""
        if not recording_wanted(settings, opted_in):
            return None
        return cls(
            Path(settings.data_dir),
            recording_id,
            mode,
            worker_id=worker_id,
            config=config,
            title=title,
            queue_size=settings.recording.writer_queue,
            extra_meta=extra_meta,
        )

    def __init__(
        self,
        data_dir: Path,
        recording_id: str,
        mode: str,
        *,
        worker_id: str,
        config: dict[str, Any],
        title: str = "",
        queue_size: int = 256,
        extra_meta: dict[str, Any] | None = None,
    ) -> None:
        self.recording_id = recording_id
        self.mode = mode
        self.dir = session_dir(data_dir, recording_id)
        self.start_ts = time.time()
        self._meta: dict[str, Any] = {
            "session_id": recording_id,
            "app_type": mode,
            "status": Status.ACTIVE.value,
            "created_at": iso(self.start_ts),
            "ended_at": None,
            "duration_s": None,
            "worker_id": worker_id,
            "title": title,
            "config": config,
            **(extra_meta or {}),
        }
        self._doc: dict[str, Any] = {
            "session_id": recording_id,
            "mode": mode,
            "worker_id": worker_id,
            "start_ts": self.start_ts,
            "config": config,
            self.entries_key: [],
        }
        self._dirty = False
        # The AI's audio plays back to back on the client: a clip starts when
        # it was sent or when the previous one ends, whichever is later.
        self._ai_cursor_ms = float("-inf")
        self._writer = Writer(
            f"recorder-{recording_id[:16]}", queue_size, self._flush, self._abandon
        )
        self._writer.submit_nowait(self._create)  # a new queue always has room

    # --- runner side (event loop) --------------------------------------------

    def ms(self, ts: float) -> float:
        """Milliseconds since the recording started."""
        return round((ts - self.start_ts) * 1000, 1)

    async def close(self, status: Status | str = Status.ENDED) -> None:
        """Finish the recording; returns at once, the writer completes it
        (and builds the replays) in the background. Idempotent."""
        ended_ts = time.time()
        await self._writer.close(lambda: self._finish(Status(status), ended_ts))

    async def flush(self) -> None:
        """Wait until everything handed over so far is on disk."""
        done = threading.Event()

        def job() -> None:
            try:
                self._flush()
            finally:
                done.set()

        await self._writer.submit(job)
        await asyncio.to_thread(done.wait)

    async def wait_closed(self, timeout: float | None = None) -> bool:
        """Wait for the writer (replays included) to finish; True if it has."""
        return await self._writer.wait_closed(timeout)

    # --- writer side -----------------------------------------------------------

    def _create(self) -> None:
        for sub in SUBDIRS:
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.dir / META, self._meta)
        write_json_atomic(self.dir / RECORDING, self._doc)

    def _file(self, relative: str, data: bytes) -> str:
        write_atomic(self.dir / relative, data)
        return relative

    def _append(self, entry: dict[str, Any]) -> None:
        self._doc[self.entries_key].append(entry)
        self._dirty = True

    def _place_ai(self, sent_ts: float, samples: int) -> float:
        at = max(self.ms(sent_ts), self._ai_cursor_ms)
        self._ai_cursor_ms = at + samples * 1000 / OUTPUT_RATE
        return round(at, 1)

    def _flush(self) -> None:
        if self._dirty:
            write_json_atomic(self.dir / RECORDING, self._doc)
            self._dirty = False

    def _finish(self, status: Status, ended_ts: float) -> None:
        self._doc["duration_ms"] = self.ms(ended_ts)
        self._doc["ended_ts"] = ended_ts
        write_json_atomic(self.dir / RECORDING, self._doc)
        self._meta.update(
            status=status.value,
            ended_at=iso(ended_ts),
            duration_s=round(ended_ts - self.start_ts, 3),
            counts={self.entries_key: len(self._doc[self.entries_key])},
        )
        if self._writer.failures:
            self._meta["write_failures"] = self._writer.failures
        write_json_atomic(self.dir / META, self._meta)
        self._meta["replays"] = build_replays(self.dir, self._doc)
        write_json_atomic(self.dir / META, self._meta)

    def _abandon(self) -> None:
        self._finish(Status.ABNORMAL, time.time())


def recording_wanted(settings: Settings, opted_in: bool) -> bool:
    return settings.recording.enabled and opted_in

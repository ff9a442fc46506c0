"""Recordings whose worker died: the gateway learns the recording id while
relaying, and when the worker is lost it closes the recording from what is
on disk, marked ``abnormal``."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from omnilive.clock import iso
from omnilive.ids import is_safe_id
from omnilive.protocol.internal import Envelope
from omnilive.recording.files import META, RECORDING, read_json, session_dir, write_json_atomic
from omnilive.recording.recorder import Status
from omnilive.recording.replay import build_replays

log = logging.getLogger(__name__)


class RecordingIdNote:
    """Remembers the recording id a worker announces for one session (its
    envelopes carry it), so that a recording left open by a worker that died
    can be closed."""

    def __init__(self, recording_id: str | None = None) -> None:
        self.recording_id = recording_id

    def note(self, envelope: Envelope) -> None:
        announced = envelope.recording_id
        if self.recording_id is None and announced is not None and is_safe_id(announced):
            self.recording_id = announced


def _last_event_ms(doc: dict[str, Any]) -> float:
    """The latest time the recording knows of, for an abandoned session's length."""
    latest = 0.0
    for chunk in doc.get("chunks") or []:
        result = chunk.get("result") or {}
        received, sent = chunk.get("receive_ts_ms") or 0, result.get("sent_ts_ms") or 0
        latest = max(latest, float(received), float(sent))
    for turn in doc.get("turns") or []:
        latest = max(latest, float(turn.get("request_ts_ms") or 0))
        for segment in (turn.get("output") or {}).get("audio_segments") or []:
            latest = max(latest, float(segment.get("at_ms") or 0))
    return latest


def recover_abandoned(data_dir: Path, recording_id: str) -> bool:
    """Close a recording whose writer died with its worker: ``status:
    abnormal``, ``ended_at`` now, replays built from the files on disk.
    Blocking (run it in a thread). Does nothing to a recording that is
    missing or already closed; returns True when it closed one."""
    try:
        directory = session_dir(data_dir, recording_id)
    except ValueError:
        return False
    meta = read_json(directory / META)
    if meta is None or meta.get("status") != Status.ACTIVE.value:
        return False
    now = time.time()
    doc = read_json(directory / RECORDING)
    start_ts = float(doc["start_ts"]) if doc and "start_ts" in doc else now
    meta.update(status=Status.ABNORMAL.value, ended_at=iso(now))
    meta["duration_s"] = round(now - start_ts, 3)
    if doc is not None:
        key = "chunks" if "chunks" in doc else "turns"
        meta["counts"] = {key: len(doc.get(key) or [])}
    write_json_atomic(directory / META, meta)
    log.warning("recording %s ended abnormally (worker lost)", recording_id)
    if doc is not None:
        # The replay spans what was recorded, not the time until we noticed.
        doc.setdefault("duration_ms", _last_event_ms(doc))
        meta["replays"] = build_replays(directory, doc)
        write_json_atomic(directory / META, meta)
    return True

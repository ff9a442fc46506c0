"""Stored reference voices: ``data_dir/ref_audio/<id>.wav`` (16 kHz mono PCM16)
plus ``registry.json`` listing them.

The gateway adds and deletes voices; workers only read them, by id, when a
session names one. Every write is atomic, and the order of writes (audio
before registry on add, registry before audio on delete) means a voice is
usable exactly when it is listed, whatever moment a process dies at.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from omnilive.audio import INPUT_RATE, AudioDecodeError, read_wav, resample, wav_bytes
from omnilive.clock import iso
from omnilive.ids import is_safe_id, mint
from omnilive.recording.files import write_atomic, write_json_atomic

VOICES_DIR = "ref_audio"
REGISTRY = "registry.json"
ID_PREFIX = "voice"
MAX_NAME_CHARS = 80


class UnknownVoice(LookupError):
    """No stored voice has this id (or the id is not one of ours)."""


class StoreFull(RuntimeError):
    """The store holds ``max_count`` voices already."""


class StoredVoice(BaseModel):
    """One registry entry, as ``GET /api/assets/ref_audio`` lists it."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    duration_s: float
    created_at: str

    def listing(self) -> dict[str, Any]:
        """The voice as the API lists it: the reference's fields (``filename``,
        ``source_type``, ``duration_ms``, ``sample_rate``) and ours."""
        return {
            **self.model_dump(),
            "filename": f"{self.id}.wav",
            "source_type": "upload",
            "duration_ms": round(self.duration_s * 1000),
            "sample_rate": INPUT_RATE,
        }


def clean_name(name: str | None, fallback: str = "voice") -> str:
    """A display name: control characters dropped, whitespace collapsed, capped."""
    text = " ".join("".join(c for c in (name or "") if c.isprintable()).split())
    return text[:MAX_NAME_CHARS] or fallback


class VoiceStore:
    """The voices under one data dir. Methods block (file I/O): call them off
    the event loop. A lock serialises registry changes within a process."""

    def __init__(self, data_dir: Path) -> None:
        self.root = Path(data_dir) / VOICES_DIR
        self._lock = threading.Lock()

    def _read_registry(self) -> list[StoredVoice]:
        try:
            document = json.loads((self.root / REGISTRY).read_bytes())
        except FileNotFoundError:
            return []
        except (OSError, ValueError):
            return []  # unreadable: as if empty; the next add rewrites it
        voices = []
        for entry in document.get("voices", []) if isinstance(document, dict) else []:
            try:
                voice = StoredVoice.model_validate(entry)
            except ValidationError:
                continue
            if is_safe_id(voice.id):
                voices.append(voice)
        return voices

    def _write_registry(self, voices: list[StoredVoice]) -> None:
        document = {"voices": [voice.model_dump() for voice in voices]}
        write_json_atomic(self.root / REGISTRY, document)

    def _wav_path(self, voice_id: str) -> Path:
        if not is_safe_id(voice_id):
            raise UnknownVoice(f"{voice_id!r} is not a voice id")
        return self.root / f"{voice_id}.wav"

    def entries(self) -> list[StoredVoice]:
        """All stored voices, oldest first."""
        return self._read_registry()

    def get(self, voice_id: str) -> StoredVoice:
        for voice in self._read_registry():
            if voice.id == voice_id:
                return voice
        raise UnknownVoice(f"no stored voice {voice_id!r}")

    def add(self, samples: np.ndarray, name: str, max_count: int) -> StoredVoice:
        """Store 16 kHz float32 ``samples`` under a fresh, unguessable id."""
        with self._lock:
            voices = self._read_registry()
            if len(voices) >= max_count:
                raise StoreFull(f"{len(voices)} voices are stored already (limit {max_count})")
            voice = StoredVoice(
                id=mint(ID_PREFIX),
                name=clean_name(name),
                duration_s=round(samples.size / INPUT_RATE, 3),
                created_at=iso(time.time()),
            )
            self.root.mkdir(parents=True, exist_ok=True)
            write_atomic(self._wav_path(voice.id), wav_bytes(samples, INPUT_RATE))
            self._write_registry([*voices, voice])
        return voice

    def load(self, voice_id: str) -> np.ndarray:
        """The voice's audio as 16 kHz float32; :class:`UnknownVoice` if absent."""
        self.get(voice_id)
        try:
            samples, rate = read_wav(self._wav_path(voice_id).read_bytes())
        except (OSError, AudioDecodeError):
            raise UnknownVoice(f"stored voice {voice_id!r} has no readable audio") from None
        return resample(samples, rate, INPUT_RATE)

    def delete(self, voice_id: str) -> StoredVoice:
        """Remove a voice; :class:`UnknownVoice` if there is none with that id."""
        with self._lock:
            voices = self._read_registry()
            found = next((voice for voice in voices if voice.id == voice_id), None)
            if found is None:
                raise UnknownVoice(f"no stored voice {voice_id!r}")
            self._write_registry([voice for voice in voices if voice.id != voice_id])
            self._wav_path(voice_id).unlink(missing_ok=True)
        return found

"""Whole 1 s units from audio that arrives in pieces of any length.

The duplex model steps once per second of audio. A ``/ws/duplex`` client
sends exactly that, but Realtime clients send what their microphone gives:
OpenAI-style clients 20–100 ms at a time, the reference's page 1 s, a file
player several seconds at once. The assembler joins and splits the pieces
into whole units, carrying with each unit what arrived with its audio: the
frames (the most recent ones, up to a cap), a ``force_listen`` from any piece
(control is never lost with the data it rode on), the latest ``max_slice_nums``
and the id of the input that completed it. A partial unit waits for more audio.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from omnilive.audio import INPUT_RATE


@dataclass(eq=False)
class Unit:
    audio: np.ndarray
    frames: list[bytes] = field(default_factory=list)
    force_listen: bool = False
    max_slice_nums: int | None = None
    input_id: str | None = None


class UnitAssembler:
    def __init__(self, max_frames: int, unit_samples: int = INPUT_RATE) -> None:
        self.unit_samples = unit_samples
        self.max_frames = max_frames
        self._pieces: list[np.ndarray] = []
        self._held = 0  # samples in ``_pieces``
        self._frames: list[bytes] = []
        self._force_listen = False
        self._max_slice_nums: int | None = None

    @property
    def pending_samples(self) -> int:
        return self._held

    def add(
        self,
        audio: np.ndarray,
        frames: list[bytes] | None = None,
        force_listen: bool = False,
        max_slice_nums: int | None = None,
        input_id: str | None = None,
    ) -> list[Unit]:
        """Take one piece; returns the units it completed (none, one or several)."""
        self._frames = [*self._frames, *(frames or [])][-self.max_frames :]
        self._force_listen = self._force_listen or force_listen
        self._max_slice_nums = max_slice_nums or self._max_slice_nums
        self._pieces.append(np.asarray(audio, dtype=np.float32))
        self._held += audio.size
        units: list[Unit] = []
        while self._held >= self.unit_samples:
            joined = np.concatenate(self._pieces)
            unit_audio, rest = joined[: self.unit_samples], joined[self.unit_samples :]
            self._pieces, self._held = [rest], rest.size
            units.append(
                Unit(unit_audio, self._frames, self._force_listen, self._max_slice_nums, input_id)
            )
            self._frames, self._force_listen = [], False
        return units

    def force_listen(self) -> None:
        """The next unit listens (a cancel that came without audio)."""
        self._force_listen = True

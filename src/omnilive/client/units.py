"""Whole one-second units out of audio of any size, without I/O.

The duplex protocol takes one ``audio_chunk`` per model unit (one second of
16 kHz audio). A microphone delivers 20 ms, a file reader whatever it reads;
the assembler joins the pieces and hands out complete units, each carrying
the frames and the ``force_listen`` given with the pieces that made it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from omnilive.client.audio import INPUT_RATE

UNIT_SAMPLES = INPUT_RATE  # one second
MAX_FRAMES = 8  # the server keeps at most this many frames per chunk (limits.max_frames_per_chunk)


@dataclass(frozen=True, eq=False)
class Unit:
    audio: np.ndarray  # exactly ``samples`` float32 samples
    frames: tuple[bytes, ...]
    force_listen: bool


class UnitAssembler:
    """Pieces in, whole units out. Frames beyond ``max_frames`` per unit keep
    the newest (what the camera shows now matters most)."""

    def __init__(self, samples: int = UNIT_SAMPLES, max_frames: int = MAX_FRAMES) -> None:
        if samples < 1 or max_frames < 0:
            raise ValueError("a unit holds at least one sample")
        self.samples = samples
        self.max_frames = max_frames
        self._pieces: list[np.ndarray] = []
        self._pending = 0
        self._frames: list[bytes] = []
        self._force_listen = False

    @property
    def pending_samples(self) -> int:
        return self._pending

    def force_listen(self) -> None:
        """The next unit out asks the model to listen (interrupting its speech)."""
        self._force_listen = True

    def add(
        self, audio: np.ndarray, frames: Sequence[bytes] = (), force_listen: bool = False
    ) -> list[Unit]:
        """Take a piece; return the units it completed (often none, sometimes several)."""
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        self._frames = [*self._frames, *frames][-self.max_frames :] if self.max_frames else []
        self._force_listen = self._force_listen or force_listen
        units: list[Unit] = []
        while audio.size:
            take = min(audio.size, self.samples - self._pending)
            self._pieces.append(audio[:take])
            self._pending += take
            audio = audio[take:]
            if self._pending == self.samples:
                units.append(self._unit())
        return units

    def flush(self) -> Unit | None:
        """The unit in progress, padded with silence to full length (None if empty)."""
        if not self._pending:
            return None
        self._pieces.append(np.zeros(self.samples - self._pending, dtype=np.float32))
        return self._unit()

    def _unit(self) -> Unit:
        unit = Unit(np.concatenate(self._pieces), tuple(self._frames), self._force_listen)
        self._pieces, self._pending, self._frames, self._force_listen = [], 0, [], False
        return unit

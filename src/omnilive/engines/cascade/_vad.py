"""Per-frame speech probabilities for any chunk size, from the shared Silero
model of ``omnilive.vad`` (the engine needs raw probabilities, not segments)."""

from __future__ import annotations

import numpy as np

from omnilive.vad import SileroModel

RATE = 16_000
FRAME = 512  # samples per probability: 32 ms at 16 kHz


class FrameVAD:
    """Streaming Silero VAD: feed chunks of any length, get one probability per frame."""

    def __init__(self) -> None:
        self._model = SileroModel(RATE)
        self._rest = np.zeros(0, dtype=np.float32)

    def feed(self, samples: np.ndarray) -> np.ndarray:
        """Probabilities of the complete frames now available; a tail waits for more."""
        data = np.concatenate([self._rest, np.asarray(samples, dtype=np.float32)])
        whole = data.size - data.size % FRAME
        self._rest = data[whole:].copy()
        probs = np.empty(whole // FRAME, dtype=np.float32)
        for i in range(probs.size):
            probs[i] = self._model.probability(data[i * FRAME : (i + 1) * FRAME])
        return probs

    def reset(self) -> None:
        self._model.reset()
        self._rest = np.zeros(0, dtype=np.float32)

    def has_speech(self, samples: np.ndarray, threshold: float, min_frames: int) -> bool:
        """Whether an independent clip holds ``min_frames`` frames of speech.

        Resets the stream first and after: for one-off checks, not live audio.
        """
        self.reset()
        try:
            return int((self.feed(samples) >= threshold).sum()) >= min_frames
        finally:
            self.reset()

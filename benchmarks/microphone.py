"""A client that sends audio the way a microphone delivers it."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

import numpy as np

RATE = 16_000


class Microphone:
    """Sends 16 kHz audio in chunks of ``chunk_s`` at real-time pace."""

    def __init__(self, ws: Any, chunk_s: float) -> None:
        self.ws = ws
        self.chunk = round(chunk_s * RATE)
        self.chunk_s = chunk_s

    async def play(self, audio: np.ndarray, stop: asyncio.Event | None = None) -> float:
        """Play ``audio`` from now; returns t0, the wall time of its first sample."""
        t0 = time.perf_counter()
        for k, start in enumerate(range(0, audio.size, self.chunk)):
            if stop is not None and stop.is_set():
                break
            delay = t0 + (k + 1) * self.chunk_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            piece = audio[start : start + self.chunk].astype("<f4").tobytes()
            message = {"type": "audio_chunk", "audio_base64": base64.b64encode(piece).decode()}
            await self.ws.send(json.dumps(message))
        return t0

"""A client that speaks to a half-duplex session the way a microphone delivers audio."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from dataclasses import dataclass
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


@dataclass(frozen=True)
class SpokenTurn:
    """One half-duplex turn as the client saw it; times in ms from the end of speech."""

    vad_ms: float  # the server said the user stopped (vad_state speaking=false)
    first_audio_ms: float  # the answer's first audio arrived
    done: dict[str, Any]  # the turn_done message (text, the engine's timings)
    first_text: str = ""  # the answer's text up to its first audio

    @property
    def after_vad_ms(self) -> float:
        return round(self.first_audio_ms - self.vad_ms, 1)


async def spoken_turn(
    ws: Any, mic: Microphone, speech: np.ndarray, lead_s: float = 0.8, tail_s: float = 3.0
) -> SpokenTurn:
    """Speak ``speech`` (after ``lead_s`` of silence, then ``tail_s`` more) at
    microphone pace on a prepared half-duplex session, stopping once the
    server starts generating as a real client does; wait for ``turn_done``."""
    audio = np.concatenate([np.zeros(round(lead_s * RATE), np.float32), speech,
                            np.zeros(round(tail_s * RATE), np.float32)])  # fmt: skip
    events: dict[str, float] = {}
    done: dict[str, Any] = {}
    said: list[str] = []  # the answer's text before its first audio
    generating = asyncio.Event()

    async def listen() -> None:
        async for raw in ws:
            message = json.loads(raw)
            now, kind = time.perf_counter(), message.get("type")
            if kind == "vad_state" and not message.get("speaking"):
                events.setdefault("vad_end", now)
            elif kind == "generating":
                generating.set()  # a real client stops sending now (echo)
            elif kind == "chunk":
                if "first_audio" not in events:
                    said.append(message.get("text_delta") or "")
                if message.get("audio_data"):
                    events.setdefault("first_audio", now)
            elif kind == "turn_done":
                done.update(message)
                return
            elif kind == "error":
                raise RuntimeError(f"server error: {message}")

    listener = asyncio.create_task(listen(), name="microphone-listener")
    t0 = await mic.play(audio, stop=generating)
    await asyncio.wait_for(listener, 180)
    speech_end = t0 + lead_s + speech.size / RATE
    return SpokenTurn(
        vad_ms=round((events["vad_end"] - speech_end) * 1000, 1),
        first_audio_ms=round((events["first_audio"] - speech_end) * 1000, 1),
        done=done,
        first_text="".join(said),
    )

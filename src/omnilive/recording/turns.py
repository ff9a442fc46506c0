"""Recordings of turn-based sessions (chat, half-duplex): one entry per turn
with its input, output and timing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from omnilive.audio import INPUT_RATE, OUTPUT_RATE, wav_bytes
from omnilive.engines.messages import AudioPart, ChatMessage, ImagePart, TextPart, VideoPart
from omnilive.recording.files import (
    AI_AUDIO,
    USER_AUDIO,
    USER_IMAGES,
    USER_VIDEOS,
    image_extension,
    video_extension,
)
from omnilive.recording.recorder import Recorder

TurnStatus = Literal["done", "interrupted", "failed"]


@dataclass
class TurnInput:
    """What the user sent: chat ``messages`` (media saved as files; the audio
    of the last user message is placed on the timeline, ending when the
    request arrived), or half-duplex ``speech`` that began at ``speech_ts``."""

    messages: Sequence[ChatMessage] = ()
    speech: np.ndarray | None = None  # 16 kHz
    speech_ts: float | None = None


@dataclass
class TurnOutput:
    """The answer as it was streamed: text, and audio chunks with the time
    each was sent (epoch seconds)."""

    text: list[str] = field(default_factory=list)
    audio: list[tuple[float, np.ndarray]] = field(default_factory=list)  # 24 kHz

    def add(self, text: str, audio: np.ndarray | None, sent_ts: float) -> None:
        self.text.append(text)
        if audio is not None and audio.size:
            self.audio.append((sent_ts, audio))


class TurnRecorder(Recorder):
    """Chat and half-duplex: ``turns[{turn_index, request_ts_ms, status,
    input, output{text, audio, audio_duration_ms, audio_segments}, timing}]``."""

    entries_key = "turns"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._counters = {USER_AUDIO: 0, USER_IMAGES: 0, USER_VIDEOS: 0}

    async def turn(
        self,
        request_ts: float,
        source: TurnInput,
        output: TurnOutput,
        timing: Mapping[str, float] | None = None,
        status: TurnStatus = "done",
        error: str | None = None,
    ) -> None:
        """Record one turn (also a failed or interrupted one, with what it
        produced so far)."""
        timing = dict(timing or {})
        audio = list(output.audio)
        text = "".join(output.text)

        def job() -> None:
            self._write_turn(request_ts, source, text, audio, timing, status, error)

        await self._writer.submit(job)

    # --- writer side -----------------------------------------------------------

    def _next(self, sub: str, extension: str) -> str:
        index = self._counters[sub]
        self._counters[sub] = index + 1
        return f"{sub}/{index:03d}.{extension}"

    def _message(self, message: ChatMessage, placed: bool, request_ms: float) -> dict[str, Any]:
        audio_ms = sum(
            p.samples.size * 1000 / INPUT_RATE for p in message.parts if isinstance(p, AudioPart)
        )
        at_ms = request_ms - audio_ms  # the last user message's audio ends on arrival
        content: list[dict[str, Any]] = []
        for part in message.parts:
            if isinstance(part, TextPart):
                content.append({"type": "text", "text": part.text})
            elif isinstance(part, AudioPart):
                duration = part.samples.size * 1000 / INPUT_RATE
                name = self._file(
                    self._next(USER_AUDIO, "wav"), wav_bytes(part.samples, INPUT_RATE)
                )
                item = {"type": "audio", "file": name, "duration_ms": round(duration, 1)}
                if placed:
                    item["at_ms"] = round(at_ms, 1)
                    at_ms += duration
                content.append(item)
            elif isinstance(part, ImagePart):
                name = self._next(USER_IMAGES, image_extension(part.data))
                content.append({"type": "image", "file": self._file(name, part.data)})
            elif isinstance(part, VideoPart):
                name = self._next(USER_VIDEOS, video_extension(part.data))
                content.append(
                    {
                        "type": "video",
                        "file": self._file(name, part.data),
                        "stack_frames": part.stack_frames,
                    }
                )
        return {"role": message.role, "content": content}

    def _input(self, source: TurnInput, request_ms: float) -> dict[str, Any]:
        result: dict[str, Any] = {}
        if source.messages:
            last_user = max(
                (i for i, m in enumerate(source.messages) if m.role == "user"), default=-1
            )
            result["messages"] = [
                self._message(m, i == last_user, request_ms) for i, m in enumerate(source.messages)
            ]
        if source.speech is not None:
            name = self._next(USER_AUDIO, "wav")
            self._file(name, wav_bytes(source.speech, INPUT_RATE))
            duration = source.speech.size * 1000 / INPUT_RATE
            start_ms = self.ms(source.speech_ts) if source.speech_ts else request_ms - duration
            result.update(
                user_audio=name,
                user_audio_duration_ms=round(duration, 1),
                user_audio_at_ms=round(start_ms, 1),
            )
        return result

    def _write_turn(
        self,
        request_ts: float,
        source: TurnInput,
        text: str,
        audio: list[tuple[float, np.ndarray]],
        timing: dict[str, float],
        status: TurnStatus,
        error: str | None,
    ) -> None:
        index = len(self._doc["turns"])
        request_ms = self.ms(request_ts)
        output: dict[str, Any] = {"text": text, "audio": None, "audio_duration_ms": 0.0}
        if audio:
            samples = np.concatenate([a for _, a in audio])
            output["audio"] = self._file(
                f"{AI_AUDIO}/{index:03d}.wav", wav_bytes(samples, OUTPUT_RATE)
            )
            output["audio_duration_ms"] = round(samples.size * 1000 / OUTPUT_RATE, 1)
            output["audio_segments"] = [
                {"at_ms": self._place_ai(ts, a.size), "samples": int(a.size)} for ts, a in audio
            ]
        entry: dict[str, Any] = {
            "turn_index": index,
            "request_ts_ms": request_ms,
            "status": status,
            "input": self._input(source, request_ms),
            "output": output,
            "timing": timing,
        }
        if error:
            entry["error"] = error
        self._append(entry)

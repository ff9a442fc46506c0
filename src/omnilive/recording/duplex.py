"""Recordings of duplex sessions (audio, omni, realtime): one entry per unit
with its receive time, the user's audio and frames, and the model's result."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from omnilive.audio import INPUT_RATE, OUTPUT_RATE, wav_bytes
from omnilive.recording.files import AI_AUDIO, USER_AUDIO, USER_FRAMES, image_extension
from omnilive.recording.recorder import Recorder

UnitMode = Literal["LISTEN", "SPEAK"]


class DuplexRecorder(Recorder):
    """``chunks[{index, receive_ts_ms, user_audio, user_frame, user_frames,
    result{mode, timing, text, ai_audio, ai_audio_duration_ms, end_of_turn,
    sent_ts_ms, ai_audio_at_ms}, dropped_before}]``."""

    entries_key = "chunks"

    async def unit(
        self,
        index: int,
        receive_ts: float,
        user_audio: np.ndarray | None,
        frames: Sequence[bytes] = (),
        *,
        mode: UnitMode,
        text: str = "",
        ai_audio: np.ndarray | None = None,
        end_of_turn: bool = False,
        timing: Mapping[str, float] | None = None,
        sent_ts: float | None = None,
        dropped_before: int = 0,
    ) -> None:
        """Record one unit: ``user_audio`` (16 kHz) and JPEG ``frames`` received
        at ``receive_ts``; the result sent at ``sent_ts`` (default: now);
        ``dropped_before`` input chunks dropped (fell behind) before this one."""
        sent_ts = time.time() if sent_ts is None else sent_ts
        timing = dict(timing or {})
        frames = list(frames)

        def job() -> None:
            self._write_unit(
                index, receive_ts, user_audio, frames, mode, text, ai_audio,
                end_of_turn, timing, sent_ts, dropped_before,
            )  # fmt: skip

        await self._writer.submit(job)

    def _write_unit(
        self,
        index: int,
        receive_ts: float,
        user_audio: np.ndarray | None,
        frames: list[bytes],
        mode: UnitMode,
        text: str,
        ai_audio: np.ndarray | None,
        end_of_turn: bool,
        timing: dict[str, float],
        sent_ts: float,
        dropped_before: int,
    ) -> None:
        entry: dict[str, Any] = {
            "index": index,
            "receive_ts_ms": self.ms(receive_ts),
            "user_audio": None,
            "user_audio_duration_ms": 0.0,
            "user_frame": None,
        }
        if user_audio is not None and user_audio.size:
            entry["user_audio"] = self._file(
                f"{USER_AUDIO}/{index:03d}.wav", wav_bytes(user_audio, INPUT_RATE)
            )
            entry["user_audio_duration_ms"] = round(user_audio.size * 1000 / INPUT_RATE, 1)
        names = [
            self._file(
                f"{USER_FRAMES}/{index:03d}{f'_{k}' if k else ''}.{image_extension(frame)}",
                frame,
            )
            for k, frame in enumerate(frames)
        ]
        if names:
            entry["user_frame"] = names[0]
        if len(names) > 1:
            entry["user_frames"] = names
        result: dict[str, Any] = {
            "mode": mode,
            "timing": timing,
            "text": text,
            "ai_audio": None,
            "ai_audio_duration_ms": 0.0,
            "end_of_turn": end_of_turn,
            "sent_ts_ms": self.ms(sent_ts),
        }
        if ai_audio is not None and ai_audio.size:
            result["ai_audio"] = self._file(
                f"{AI_AUDIO}/{index:03d}.wav", wav_bytes(ai_audio, OUTPUT_RATE)
            )
            result["ai_audio_duration_ms"] = round(ai_audio.size * 1000 / OUTPUT_RATE, 1)
            result["ai_audio_at_ms"] = self._place_ai(sent_ts, ai_audio.size)
        entry["result"] = result
        entry["dropped_before"] = dropped_before
        self._append(entry)

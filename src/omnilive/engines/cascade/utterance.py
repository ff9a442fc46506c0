"""Where the user's utterances start and end in a live 16 kHz stream.

Duplex audio arrives in 1 s units; this tracker turns it into decisions (speech
started, utterance finished) and collects the utterance's samples, with a short
pre-roll so the first syllable is not lost to the VAD's reaction time. With an
end-of-turn model (:class:`TurnJudging`) an utterance that sounds finished ends
after a short silence, judged again each ``check_ms`` until confirmed, instead
of waiting out ``end_silence_ms``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import numpy as np

from omnilive.engines.cascade._vad import FRAME, RATE, FrameVAD

FRAME_MS = 1000 * FRAME / RATE


@dataclass(frozen=True)
class TurnTaking:
    """VAD thresholds and timings; the defaults suit a 1 s unit loop."""

    start_threshold: float = 0.5
    end_threshold: float = 0.35  # hysteresis: speech goes on until the probability drops below
    start_ms: float = 96.0  # voiced time that starts an utterance
    end_silence_ms: float = 640.0  # silence that ends it
    min_speech_ms: float = 200.0  # shorter utterances are noise
    preroll_ms: float = 300.0
    tail_ms: float = 150.0  # silence kept after the last voiced frame


@dataclass(frozen=True)
class TurnJudging:
    """The end-of-turn model's part: ``complete`` (blocking, tens of ms) says
    whether an utterance sounds finished; ``confirmations`` such verdicts in a
    row, ``check_ms`` of silence apart, end it."""

    complete: Callable[[np.ndarray], bool]
    check_ms: float = 200.0
    confirmations: int = 2


class _State(Enum):
    IDLE = "idle"
    SPEECH = "speech"


@dataclass(eq=False)
class Heard:
    """What one chunk of audio changed."""

    voiced_ms: float = 0.0  # voiced audio in this chunk
    started: bool = False  # an utterance began in this chunk
    finished: np.ndarray | None = None  # a complete utterance (16 kHz)

    @property
    def speaking(self) -> bool:
        return self.started or self.voiced_ms > 0


class UtteranceTracker:
    """Feeds audio through Silero VAD and reports utterance boundaries."""

    def __init__(
        self, vad: FrameVAD, params: TurnTaking | None = None, judging: TurnJudging | None = None
    ) -> None:
        self._vad = vad
        self.params = params or TurnTaking()
        self._judging = judging
        self._checks = 0  # end-of-turn checks of the current silence
        self._agreed = 0  # of them, the last ones in a row that found the utterance finished
        self._state = _State.IDLE
        self._rest = np.zeros(0, dtype=np.float32)
        self._frames: list[np.ndarray] = []  # pre-roll while idle, the utterance in speech
        self._run = 0  # consecutive voiced (idle) or silent (speech) frames
        self._voiced = 0  # voiced frames in the current utterance
        self._last_voiced = 0  # frame index (in _frames) after the last voiced one

    @property
    def in_speech(self) -> bool:
        return self._state is _State.SPEECH

    @property
    def voiced_ms(self) -> float:
        """Voiced audio in the utterance under way (0 when idle)."""
        return self._voiced * FRAME_MS if self.in_speech else 0.0

    def reset(self) -> None:
        self._vad.reset()
        self._state = _State.IDLE
        self._rest = np.zeros(0, dtype=np.float32)
        self._frames, self._run, self._voiced, self._last_voiced = [], 0, 0, 0
        self._checks = self._agreed = 0

    def prepend(self, audio: np.ndarray) -> None:
        """Put an earlier utterance in front of the current one (the user went on)."""
        if self.in_speech and audio.size:
            self._frames.insert(0, audio.astype(np.float32, copy=False))
            self._last_voiced += 1

    def feed(self, samples: np.ndarray) -> Heard:
        data = np.concatenate([self._rest, np.asarray(samples, dtype=np.float32)])
        whole = data.size - data.size % FRAME
        self._rest = data[whole:].copy()
        heard = Heard()
        for start in range(0, whole, FRAME):
            frame = data[start : start + FRAME]
            (prob,) = self._vad.feed(frame)
            if prob >= self.params.start_threshold:
                heard.voiced_ms += FRAME_MS
            self._step(frame, float(prob), heard)
        return heard

    def _frames_for(self, ms: float) -> int:
        return max(1, round(ms / FRAME_MS))

    def _step(self, frame: np.ndarray, prob: float, heard: Heard) -> None:
        p = self.params
        self._frames.append(frame)
        if self._state is _State.IDLE:
            self._run = self._run + 1 if prob >= p.start_threshold else 0
            del self._frames[: -self._frames_for(p.preroll_ms)]
            if self._run >= self._frames_for(p.start_ms):
                self._state, heard.started = _State.SPEECH, True
                self._voiced, self._last_voiced = self._run, len(self._frames)
                self._run = 0
            return
        if prob >= p.end_threshold:
            self._run = self._checks = self._agreed = 0
            self._voiced += prob >= p.start_threshold
            self._last_voiced = len(self._frames)
            return
        self._run += 1
        if self._run >= self._frames_for(p.end_silence_ms) or self._judged_finished():
            keep = self._last_voiced + self._frames_for(p.tail_ms)
            utterance = np.concatenate(self._frames[:keep])
            enough = self._voiced >= self._frames_for(p.min_speech_ms)
            self._state, self._frames, self._run = _State.IDLE, [], 0
            self._checks = self._agreed = 0
            if enough:
                heard.finished = utterance

    def _judged_finished(self) -> bool:
        """At each ``check_ms`` of silence, the model's verdict; True once the
        last ``confirmations`` of this silence agreed it is finished."""
        judging = self._judging
        if judging is None or self._run != self._frames_for(judging.check_ms) * (self._checks + 1):
            return False
        self._checks += 1
        finished = judging.complete(np.concatenate(self._frames))
        self._agreed = self._agreed + 1 if finished else 0
        return self._agreed >= judging.confirmations

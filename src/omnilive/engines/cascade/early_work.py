"""What the half-duplex view starts before a turn ends, and how a turn was served.

:class:`EarlyWork` is one version of the speech handed to the session's
thread (a transcript while the user speaks, or at a pause the answer as
well); :class:`TurnStats` is what the last turn cost, reported in
``turn_done.timings``.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from omnilive.engines.cascade.answer import AnswerStream, SpokenSentence
from omnilive.engines.cascade.asr import Transcript
from omnilive.engines.cascade.conversation import Fit
from omnilive.engines.messages import TextAudioChunk


@dataclass(eq=False)
class EarlyWork:
    """Work started from one version of the speech, before the turn's prefill."""

    speech: np.ndarray
    speculative: bool  # also start the answer (the VAD heard a pause)
    # Made at a quiet moment: its speech ends in silence, so the same speech
    # with more silence has the same words. A transcript made every second may
    # end inside a word, whose rest a tail check can take for silence.
    quiet: bool = False
    cancel: threading.Event = field(default_factory=threading.Event)
    future: Future[None] | None = None
    transcript: Transcript | None = None
    fit: Fit | None = None
    answer: AnswerStream | None = None
    head: list[TextAudioChunk] = field(default_factory=list)  # chunks already made
    heard: EarlyWork | None = None  # an earlier transcript of the same speech to reuse
    end_p: float | None = None  # the LLM's chance the user's words end the turn
    end_readings: tuple[float, float | None] | None = None  # its two readings (bare, heard)
    judged_tokens: int | None = None  # its pass's tokens (with the answer's opener)
    judge_ms: float | None = None  # that pass's time
    judged: threading.Event = field(default_factory=threading.Event)  # end_p is known (or never)
    asked: float = field(default_factory=time.perf_counter)  # when hear() asked for it
    started: float | None = None  # when the session's thread took it up
    ready: float | None = None  # when its first piece's audio was made
    _closing: threading.Lock = field(default_factory=threading.Lock)

    def discard(self) -> None:
        """Close a parked answer; safe from either thread, and more than once."""
        with self._closing:
            answer, self.answer = self.answer, None
        if answer is not None:
            answer.close()


@dataclass
class TurnStats:
    """How the last turn was served (for benchmarks and logs)."""

    transcript: str = ""
    asr_ms: float = 0.0
    speculative: bool = False  # prefill adopted an answer started in hear()
    transcribed_early: bool = False  # ...whose transcript was made before the pause
    llm_first_token_ms: float | None = None
    first_sentence_audio_ms: float | None = None
    judged_tokens: int | None = None  # new to the LLM at the pause (the rest read ahead)
    judge_ms: float | None = None  # evaluating them (with the answer's opener)
    words_end_p: float | None = None  # the LLM's chance the words heard ended the turn
    # From the moment the pause was heard (hear): until the early answer's
    # work began (it waits for a transcript in flight), and until its first
    # audio was ready.
    early_queue_ms: float | None = None
    early_audio_ms: float | None = None

    @classmethod
    def adopted(cls, early: EarlyWork, transcript: Transcript) -> TurnStats:
        """The stats of a turn answered by ``early``'s parked answer."""
        reused = early.heard is not None and early.heard.transcript is transcript
        return cls(
            transcript.text,
            transcript.cost_ms,
            speculative=True,
            transcribed_early=reused,
            judged_tokens=early.judged_tokens,
            judge_ms=early.judge_ms,
            words_end_p=early.end_p,
            early_queue_ms=_ms_between(early.asked, early.started),
            early_audio_ms=_ms_between(early.asked, early.ready),
        )

    def timings(self, first_sentence: SpokenSentence | None) -> dict[str, float]:
        """``turn_done.timings``: every figure known, in ms (counts as floats)."""
        timings = {"asr_ms": round(self.asr_ms, 1), "speculative": float(self.speculative)}
        for name in _OPTIONAL_FIGURES:
            value = getattr(self, name)
            if value is not None:
                timings[name] = round(float(value), 3 if name == "words_end_p" else 1)
        if first_sentence is not None:
            timings["llm_first_sentence_ms"] = round(first_sentence.llm_ms, 1)
            timings["tts_first_sentence_ms"] = round(first_sentence.tts_ms, 1)
        return timings


# The figures a turn may lack (reported only when known), named as in timings.
_OPTIONAL_FIGURES = (
    "llm_first_token_ms",
    "first_sentence_audio_ms",
    "judged_tokens",
    "judge_ms",
    "words_end_p",
    "early_queue_ms",
    "early_audio_ms",
)


def _ms_between(start: float, end: float | None) -> float | None:
    return None if end is None else (end - start) * 1000

"""A duplex answer: made on a background thread, spoken one 1 s unit at a time.

The producer (the session's thread) appends each sentence's audio as soon as
espeak has it; the consumer (``generate()`` on the runner's thread) takes up to
one unit of it per call. A condition variable lets the consumer wait a
bounded moment for audio without ever blocking the producer.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from omnilive.audio import OUTPUT_RATE
from omnilive.engines.cascade.answer import SpokenSentence
from omnilive.engines.cascade.asr import Transcript
from omnilive.engines.cascade.conversation import Fit

UNIT_SAMPLES = OUTPUT_RATE  # 1 s of output audio


@dataclass(eq=False)
class Piece:
    """One unit's worth of a reply."""

    audio: np.ndarray
    sentences: list[SpokenSentence]
    last: bool  # nothing more will come: this unit ends the turn


@dataclass(eq=False)
class Reply:
    """Shared state of one answer between its producer and its consumer."""

    utterance: np.ndarray  # what the user said (16 kHz)
    cancel: threading.Event = field(default_factory=threading.Event)
    future: Future[None] | None = None
    transcript: Transcript | None = None
    fit: Fit | None = None  # the prompt, and the history it drops when committed
    n_tokens: int = 0
    committed: bool = False  # the user's turn went into the history
    _cond: threading.Condition = field(default_factory=threading.Condition)
    # Audio not yet handed out, and where each sentence starts in the whole reply.
    _audio: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    _marks: list[tuple[int, SpokenSentence]] = field(default_factory=list)  # (first sample, …)
    _produced: int = 0  # samples pushed so far
    _taken: int = 0  # samples handed out so far
    _done: bool = False
    spoken: list[SpokenSentence] = field(default_factory=list)  # sentences handed out

    # --- producer side ---------------------------------------------------

    def push(self, sentence: SpokenSentence) -> None:
        """Queue a sentence's audio; one with nothing speakable in it is skipped."""
        if sentence.audio is None or not sentence.audio.size:
            return
        with self._cond:
            self._marks.append((self._produced, sentence))
            self._audio = np.concatenate([self._audio, sentence.audio])
            self._produced += sentence.audio.size
            self._cond.notify_all()

    def finish(self) -> None:
        with self._cond:
            self._done = True
            self._cond.notify_all()

    # --- consumer side ---------------------------------------------------

    @property
    def started(self) -> bool:
        """Some of it has been handed out: the model is speaking."""
        return self._taken > 0

    @property
    def done(self) -> bool:
        return self._done

    def take(self, wait_s: float, unit: int = UNIT_SAMPLES) -> Piece | None:
        """Up to one unit of audio, waiting at most ``wait_s`` for a full one.

        None when no audio is ready yet; a piece without audio (and ``last``)
        when the reply is over and everything has been handed out.
        """
        with self._cond:
            self._cond.wait_for(lambda: self._done or self._audio.size >= unit, timeout=wait_s)
            n = min(unit, self._audio.size)
            if n == 0:
                return Piece(self._audio[:0], [], last=True) if self._done else None
            audio, self._audio = self._audio[:n], self._audio[n:]
            self._taken += n
            # A sentence's text goes out with the unit in which its audio begins.
            sentences = [s for at, s in self._marks if at < self._taken]
            self._marks = [(at, s) for at, s in self._marks if at >= self._taken]
            self.spoken.extend(sentences)
            return Piece(audio, sentences, last=self._done and not self._audio.size)

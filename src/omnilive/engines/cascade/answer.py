"""One spoken answer: LLM text streamed token by token, speech per sentence.

Every view answers the same way: tokens become text chunks at once, and each
sentence is handed to espeak-ng the moment it is complete, its audio riding on
the next chunk, so the first sentence can play while the rest is generated.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from omnilive.audio import OUTPUT_RATE
from omnilive.engines.cascade.llm import LlamaChat
from omnilive.engines.cascade.tts import Speech
from omnilive.engines.messages import GenerationOptions, TextAudioChunk, ToolCall

# A sentence ends at . ! ? (or a line break) once the next text starts with
# whitespace: "3.5" and "e.g.," do not end one, "Paris. It" does.
_SENTENCE_END = re.compile(r"[.!?…]+[\"')\]]*\s|\n")
# Long sentences are cut after a clause, so speech starts sooner; the first
# piece of an answer is cut harder still (a few words), since the user is
# waiting for it.
_CLAUSE_END = re.compile(r"[,;:]\s")
_WORD_END = re.compile(r"\S\s")
CLAUSE_MIN_WORDS = 8
# No punctuation yet: cut at a word boundary. Two words are ~3 tokens of
# SmolLM2 and ~40 ms of Piper on 2 cores; twelve took ~250 + 170 ms of the
# time the user waits for the first sound (end of speech to first audio, p50:
# 945 ms with twelve, ~915 with six, ~700 with four; from four to three, one
# token and ~20 ms of Piper fewer; from three to two, 493/533 -> 428/441 ms in
# alternating server runs, the first piece's tokens 70 -> 41 ms and its
# Piper 68 -> 46). The piece is read as a clause, with a short pause
# (spoken_as, shortened_pause), so the seam sounds like a phrase break; the
# rest of the sentence is ready long before two words have been heard. The
# duplex loop keeps twelve (DUPLEX_FIRST_WORDS):
# its 1 s units are cut from what is buffered, and a thin first piece left a
# middle unit short on a loaded machine.
FIRST_MAX_WORDS = 2
SEAM_PAUSE_S = 0.08  # quiet kept after a piece cut between two words
QUIET_LEVEL = 0.01  # sample amplitude below which the voices' output is quiet
# What a piece may already end with (a sentence's or a clause's end).
_CLOSING_MARKS = ".!?…,;:\"')]"
DUPLEX_FIRST_WORDS = 12


class SentenceSplitter:
    """Cuts a stream of text pieces into sentences as soon as each is complete;
    the first is cut after ``first_words`` words if no sentence ends sooner."""

    def __init__(self, first_words: int = FIRST_MAX_WORDS) -> None:
        self._pending = ""
        self._first = True
        self._first_words = first_words

    def feed(self, piece: str) -> list[str]:
        """Add a piece; return the sentences it completed (without trailing space)."""
        self._pending += piece
        done: list[str] = []
        while True:
            cut = self._cut()
            if cut is None:
                return done
            sentence, self._pending = self._pending[:cut], self._pending[cut:]
            if sentence.strip():
                done.append(sentence.strip())
                self._first = False

    def flush(self) -> str:
        rest, self._pending = self._pending.strip(), ""
        return rest

    def _cut(self) -> int | None:
        """Where the pending text should be cut, if anywhere yet."""
        end = _SENTENCE_END.search(self._pending)
        if end is not None:
            return end.end()
        if self._first:
            # Only completed words count: the last one may still be growing.
            words = list(_WORD_END.finditer(self._pending))
            n = self._first_words
            return words[n - 1].end() if len(words) >= n else None
        for clause in _CLAUSE_END.finditer(self._pending):
            if len(self._pending[: clause.start()].split()) >= CLAUSE_MIN_WORDS:
                return clause.end()
        return None


@dataclass
class SpokenSentence:
    """A sentence of the answer with its audio and what it cost."""

    text: str
    audio: np.ndarray | None  # 24 kHz; None when speech is off
    n_tokens: int
    llm_ms: float  # generating its tokens (the first sentence includes the prompt)
    tts_ms: float


@dataclass
class AnswerStats:
    """Timings of one answer, from the moment it was asked for."""

    n_tokens: int = 0
    first_token_ms: float | None = None
    first_audio_ms: float | None = None
    sentences: list[SpokenSentence] = field(default_factory=list)


class AnswerStream:
    """Iterates one answer as :class:`TextAudioChunk` s; see the module docstring.

    ``cancel`` stops it between tokens. ``text`` and ``stats`` fill in as it
    runs, so a caller that stops early still knows what was said.
    """

    def __init__(
        self,
        llm: LlamaChat,
        tts: Speech,
        prompt: list[int],
        options: GenerationOptions,
        max_tokens: int,
        voice: str | None,
        cancel: threading.Event | None = None,
        first_words: int = FIRST_MAX_WORDS,
    ) -> None:
        self._llm = llm
        self._first_words = first_words
        self._tts = tts
        self._prompt = prompt
        self._options = options
        self._max_tokens = max_tokens
        self._voice = voice  # None: text only
        self._cancel = cancel or threading.Event()
        self.text = ""
        self.stats = AnswerStats()
        self._chunks = self._run()

    def __iter__(self) -> Iterator[TextAudioChunk]:
        return self._chunks

    def __next__(self) -> TextAudioChunk:
        return next(self._chunks)

    def close(self) -> None:
        self._chunks.close()

    def _run(self) -> Iterator[TextAudioChunk]:
        started = mark = time.perf_counter()
        splitter = SentenceSplitter(self._first_words)
        sentence_tokens = 0
        tokens = self._llm.stream(self._prompt, self._options, self._max_tokens)
        try:
            for piece in tokens:
                if self._cancel.is_set():
                    return
                if isinstance(piece, ToolCall):  # a whole call (remote_llm.py)
                    yield TextAudioChunk(tool_call=piece, n_tokens=1)
                    continue
                now = time.perf_counter()
                if self.stats.first_token_ms is None:
                    self.stats.first_token_ms = (now - started) * 1000
                self.stats.n_tokens += 1
                sentence_tokens += 1
                self.text += piece
                audio = None
                for sentence in splitter.feed(piece):
                    spoken = self._speak(sentence, sentence_tokens, mark, started, more=True)
                    audio = _join(audio, spoken)
                    sentence_tokens, mark = 0, time.perf_counter()
                if piece or audio is not None:
                    yield TextAudioChunk(text=piece, audio=audio, n_tokens=1)
            if self._cancel.is_set():
                return
            rest = splitter.flush()
            if rest:
                audio = self._speak(rest, sentence_tokens, mark, started)
                if audio is not None:
                    yield TextAudioChunk(audio=audio)
        finally:
            tokens.close()  # type: ignore[attr-defined]  # stream() is a generator: it has close()

    def _speak(
        self, sentence: str, n_tokens: int, since: float, started: float, more: bool = False
    ) -> np.ndarray | None:
        """Speech for one piece; ``more`` when the answer goes on after it."""
        llm_ms = (time.perf_counter() - since) * 1000
        audio, tts_ms = (None, 0.0)
        if self._voice is not None:
            spoken = spoken_as(sentence, more)
            audio, tts_ms = self._tts.timed(spoken, self._voice)
            if spoken != sentence:
                audio = shortened_pause(audio)
            if self.stats.first_audio_ms is None and audio.size:
                self.stats.first_audio_ms = (time.perf_counter() - started) * 1000
        if audio is not None and not audio.size:
            audio = None  # nothing speakable in it ("...")
        self.stats.sentences.append(SpokenSentence(sentence, audio, n_tokens, llm_ms, tts_ms))
        return audio


def spoken_as(piece: str, more: bool) -> str:
    """The text a piece is spoken from. A piece cut between two words
    (the first piece) goes on in the next one: it is read as a clause,
    with a comma. Given no punctuation, the voices end it as a sentence
    with its fall ("The moon is." then "about 384,400 kilometers...")."""
    if more and piece and piece[-1] not in _CLOSING_MARKS:
        return piece + ","
    return piece


def shortened_pause(audio: np.ndarray) -> np.ndarray:
    """``audio`` (a piece spoken as a clause, :func:`spoken_as`) with the
    quiet at its end cut to :data:`SEAM_PAUSE_S`: the voices end every
    piece with ~0.2 s of it, and with the next piece's own lead-in the seam
    inside a sentence was a quarter-second gap."""
    loud = np.flatnonzero(np.abs(audio) > QUIET_LEVEL)
    if not loud.size:
        return audio
    return audio[: min(audio.size, loud[-1] + 1 + round(SEAM_PAUSE_S * OUTPUT_RATE))]


def _join(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
    if a is None or b is None:
        return b if a is None else a
    return np.concatenate([a, b])

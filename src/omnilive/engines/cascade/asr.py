"""Speech to text: Whisper base (CTranslate2, int8) through faster-whisper.

Whisper's encoder is trained on 30 s windows and faster-whisper always pads to
one, so every call pays ~0.5 s on two cores however short the speech. The
CTranslate2 encoder also accepts shorter mel windows (whisper.cpp's
``audio_ctx`` idea): a window sized to the speech plus a margin costs ~100 ms
for a 2 s question with the same transcripts on our test phrases. Short windows
occasionally make Whisper loop over its own sentence; such output is cut back
to one period, and output that still runs to the length cap, or ends in a
short phrase said over and over, is redone the standard way (30 s window,
faster-whisper's own decoding loop).
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from omnilive.audio import INPUT_RATE
from omnilive.engines.base import EngineError

FRAMES_PER_SECOND = 100  # mel frames (10 ms hop)
FULL_WINDOW_FRAMES = 3000  # Whisper's native 30 s
# Room after the speech. With 0.5 s, a clip that ends 50 ms after its last
# word (an early transcript at a pause) often came back as its first word
# alone ("What", "Why"): 8 of 42 Piper questions, none with 1 s (+28 ms).
WINDOW_MARGIN_FRAMES = 100
WINDOW_STEP_FRAMES = 100  # round windows up to whole seconds
TOKENS_PER_SECOND_CAP = 10  # fast speech is ~7 tokens/s; more than this is a loop
LOOP_COPIES = 4  # a short phrase this many times in a row at the end is a loop too
NO_SPEECH_THRESHOLD = 0.6
LOGPROB_THRESHOLD = -1.0  # mean log-probability per token
DEFAULT_LANGUAGE = "en"
_SENTENCE_END = re.compile(r"(?<=[.?!])\s+")
_WORD = re.compile(r"[\w']+")


@dataclass(frozen=True)
class Transcript:
    """What Whisper heard in one clip."""

    text: str
    seconds: float  # audio length
    cost_ms: float
    window_s: float  # encoder window used (30 s on the fallback path)
    # Whisper's mean log-probability per token of the text (None where it
    # was not kept: silence, the fallback path): how sure it was of the words.
    logprob: float | None = None


def collapse_repeats(tokens: list[int], min_period: int = 3) -> list[int]:
    """Cut output that repeats one phrase over and over down to one copy.

    Returns ``tokens[:p]`` for the shortest period ``p`` (at least
    ``min_period`` tokens) whose copies cover the whole output at least twice,
    allowing a cut-off last copy; otherwise ``tokens`` unchanged.
    """
    n = len(tokens)
    for period in range(min_period, n // 2 + 1):
        if all(tokens[i] == tokens[i - period] for i in range(period, n)):
            return tokens[:period]
    return tokens


def ends_in_loop(tokens: list[int], copies: int = LOOP_COPIES, longest: int = 4) -> bool:
    """Whether the output ends in a phrase of up to ``longest`` tokens said
    ``copies`` times or more in a row: Whisper stuck at the end of a short
    window ("...push air down w w w w w w w w w w w" for "downwards"), with
    words before the loop, so :func:`collapse_repeats` keeps it whole."""
    for period in range(1, longest + 1):
        tail = tokens[-period:]
        if len(tokens) >= period * copies and all(
            tokens[len(tokens) - period * (k + 1) : len(tokens) - period * k] == tail
            for k in range(1, copies)
        ):
            return True
    return False


def drop_echo(text: str) -> str:
    """Cut a tail that only starts one of the text's sentences over again.

    On a short window Whisper sometimes finishes the speech and begins a
    sentence a second time ("Which animal is the largest on our planet?
    Which animal is the largest on"; "My friend has a birthday on Saturday.
    What present do you think she would like? What present do you think she
    would"): not a loop of token ids (the case differs), yet it makes a
    finished question read as cut off. A tail after a sentence end whose
    words (two or more) are the first words of a sentence before it is
    dropped.
    """
    starts = [0, *(end.end() for end in _SENTENCE_END.finditer(text))]
    for i, end in enumerate(_SENTENCE_END.finditer(text), start=1):
        head, again = text[: end.start()].strip(), _words(text[end.end() :])
        if len(again) < 2:
            continue
        earlier = (_words(text[start:])[: len(again)] for start in starts[:i])
        if any(words == again for words in earlier):
            return head
    return text


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def window_frames(n_samples: int) -> int:
    """Encoder window for a clip: the speech plus a margin, in whole seconds."""
    frames = n_samples * FRAMES_PER_SECOND // INPUT_RATE + WINDOW_MARGIN_FRAMES
    frames = -(-frames // WINDOW_STEP_FRAMES) * WINDOW_STEP_FRAMES
    return min(FULL_WINDOW_FRAMES, frames)


class WhisperASR:
    """A loaded Whisper model; :meth:`transcribe` is safe to call from any thread."""

    def __init__(self, model_dir: Path, threads: int, device: str = "cpu") -> None:
        self._model_dir = model_dir
        self._threads = threads
        self._device = device  # "cpu", or "cuda" for a Whisper beside a GPU engine
        self._whisper = None
        self._tokenizers: dict[str, object] = {}
        # CTranslate2 would queue concurrent calls anyway; the lock keeps two
        # sessions from each spawning their own threads on two cores.
        self._lock = threading.Lock()

    def load(self) -> None:
        from faster_whisper import WhisperModel

        self._whisper = WhisperModel(
            str(self._model_dir),
            device=self._device,
            compute_type="int8" if self._device == "cpu" else "float16",
            cpu_threads=self._threads,
            num_workers=1,
        )

    def languages(self) -> list[str]:
        return list(self._loaded().supported_languages)

    def transcribe(self, samples: np.ndarray, language: str | None = None) -> Transcript:
        """Transcribe 16 kHz mono float32 speech; empty text for silence."""
        started = time.perf_counter()
        samples = np.ascontiguousarray(samples, dtype=np.float32)
        seconds = samples.size / INPUT_RATE
        if samples.size < INPUT_RATE // 10:
            return Transcript("", seconds, 0.0, 0.0)
        lang = self._language(language)
        with self._lock:
            text, window, logprob = self._windowed(samples, lang)
            if text is None:
                text, window = self._full_window(samples, lang), FULL_WINDOW_FRAMES
        cost = (time.perf_counter() - started) * 1000
        return Transcript(text, seconds, cost, window / FRAMES_PER_SECOND, logprob)

    def _loaded(self):  # -> faster_whisper.WhisperModel
        if self._whisper is None:
            raise EngineError("the ASR model is not loaded")
        return self._whisper

    def _language(self, language: str | None) -> str:
        """A Whisper language code from an espeak-style name ("en-us" → "en")."""
        code = (language or DEFAULT_LANGUAGE).lower().replace("_", "-").split("-")[0]
        return code if code in self.languages() else DEFAULT_LANGUAGE

    def _tokenizer(self, language: str):  # -> faster_whisper.tokenizer.Tokenizer
        if language not in self._tokenizers:
            from faster_whisper.tokenizer import Tokenizer

            whisper = self._loaded()
            self._tokenizers[language] = Tokenizer(
                whisper.hf_tokenizer,
                whisper.model.is_multilingual,
                task="transcribe",
                language=language,
            )
        return self._tokenizers[language]

    def _windowed(self, samples: np.ndarray, language: str) -> tuple[str | None, int, float | None]:
        """Greedy decoding on a window sized to the speech (its text, None if
        it ran away; the window; the text's mean log-probability per token)."""
        import ctranslate2

        whisper = self._loaded()
        tokenizer = self._tokenizer(language)
        mel = whisper.feature_extractor(samples)
        frames = window_frames(samples.size)
        features = np.zeros((1, mel.shape[0], frames), dtype=np.float32)
        used = min(frames, mel.shape[1])
        features[0, :, :used] = mel[:, :used]
        prompt = [*tokenizer.sot_sequence, tokenizer.no_timestamps]
        budget = 8 + int(samples.size / INPUT_RATE * TOKENS_PER_SECOND_CAP)
        (result,) = whisper.model.generate(
            ctranslate2.StorageView.from_array(features),
            [prompt],
            beam_size=1,
            max_length=len(prompt) + budget,
            return_no_speech_prob=True,
            return_scores=True,
        )
        # Whisper's own silence rule: the no-speech token is likely AND the
        # text is unlikely (a confident transcript of quiet speech is kept).
        logprob = float(result.scores[0])
        if result.no_speech_prob > NO_SPEECH_THRESHOLD and logprob < LOGPROB_THRESHOLD:
            return "", frames, None
        tokens = [t for t in result.sequences_ids[0] if t < tokenizer.eot]
        tokens = collapse_repeats(tokens)
        if len(tokens) >= budget or ends_in_loop(tokens):
            return None, frames, None
        return drop_echo(tokenizer.decode(tokens).strip()), frames, logprob

    def _full_window(self, samples: np.ndarray, language: str) -> str:
        segments, _ = self._loaded().transcribe(
            samples,
            language=language,
            beam_size=1,
            without_timestamps=True,
            condition_on_previous_text=False,
        )
        return " ".join(s.text.strip() for s in segments).strip()

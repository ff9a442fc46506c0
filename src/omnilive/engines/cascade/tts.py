"""Text to speech: a Piper voice for English, Debian's espeak-ng for the rest.

Each sentence is synthesised on its own as soon as the LLM completes it.
espeak-ng (run as a separate program) speaks a sentence in ~15 ms at 22,050
Hz; the Piper voice (``piper.py``) sounds natural and takes longer. Both are
resampled to the 24 kHz of the wire. Neither can imitate a reference
recording; callers report that (see :meth:`Speech.resolve_voice`).
"""

from __future__ import annotations

import re
import shutil
import time
from dataclasses import dataclass, field

import numpy as np

from omnilive.audio import OUTPUT_RATE, AudioDecodeError, read_wav, resample
from omnilive.engines.base import EngineError
from omnilive.engines.cascade.phonemes import ESPEAK, run_espeak
from omnilive.engines.cascade.piper import PiperVoice
from omnilive.engines.messages import Voice

# Markup a chat model likes to emit that espeak would read out ("asterisk").
_UNSPOKEN = re.compile(r"[*_#`~|<>\[\]{}]+")
_SPEAKABLE = re.compile(r"\w")


@dataclass(frozen=True)
class SpokenVoice:
    """The espeak voice a session speaks with, and why it differs from the request."""

    espeak: str
    warnings: tuple[str, ...] = field(default=())


def speakable(text: str) -> str:
    """Text as espeak should read it; empty if nothing in it can be said."""
    cleaned = " ".join(_UNSPOKEN.sub(" ", text).split())
    return cleaned if _SPEAKABLE.search(cleaned) else ""


class EspeakTTS:
    """espeak-ng behind a small API: known voices and 24 kHz float32 synthesis."""

    def __init__(self, default_voice: str) -> None:
        self._default = default_voice
        self._voices: set[str] = set()

    @property
    def default(self) -> str:
        return self._default

    def load(self) -> None:
        if shutil.which(ESPEAK) is None:
            raise EngineError(f"{ESPEAK} is not installed (apt-get install {ESPEAK})")
        listing = self._run(["--voices"], b"").decode("utf-8", "replace")
        self._voices = parse_voices(listing)
        if self._default.lower() not in self._voices:
            raise EngineError(f"the default espeak-ng voice {self._default!r} does not exist")

    def knows(self, name: str) -> bool:
        base = name.lower().split("+", 1)[0]  # "en-us+f3": a voice plus a variant
        return base in self._voices

    def synthesize(self, text: str, voice: str) -> np.ndarray:
        """24 kHz float32 speech for ``text``; an empty array if nothing is speakable."""
        text = speakable(text)
        if not text:
            return np.zeros(0, dtype=np.float32)
        wav = self._run(["-v", voice, "-b", "1", "--stdout"], text.encode("utf-8"))
        try:
            samples, rate = read_wav(wav)
        except AudioDecodeError as exc:
            raise EngineError(f"{ESPEAK} produced no audio: {exc}") from exc
        return resample(samples, rate, OUTPUT_RATE)

    def timed(self, text: str, voice: str) -> tuple[np.ndarray, float]:
        started = time.perf_counter()
        audio = self.synthesize(text, voice)
        return audio, (time.perf_counter() - started) * 1000

    def resolve_voice(self, voice: Voice | None) -> SpokenVoice:
        """Pick the espeak voice for a request, saying what could not be honoured.

        A reference recording cannot be imitated by espeak: the answer is still
        spoken, with the named or default voice, and a warning says so.
        """
        warnings: list[str] = []
        if voice is not None and voice.reference is not None:
            warnings.append(
                "voice cloning is not available on the cascade engine: the reference "
                "audio was not used; speaking with an espeak-ng voice instead"
            )
        for wanted in (voice.name, voice.language) if voice is not None else ():
            if not wanted:
                continue
            if self.knows(wanted):
                return SpokenVoice(wanted.lower(), tuple(warnings))
            warnings.append(f"espeak-ng has no voice {wanted!r}")
        return SpokenVoice(self._default, tuple(warnings))

    @staticmethod
    def _run(args: list[str], stdin: bytes) -> bytes:
        output = run_espeak(args, stdin)
        if not output and args[0] != "--voices":
            raise EngineError(f"{ESPEAK} printed nothing for {' '.join(args)}")
        return output


def parse_voices(listing: str) -> set[str]:
    """Voice names from ``espeak-ng --voices``: language codes, names and files.

    MBROLA voices (files under ``mb/``) are left out: they need a separate
    program and voice data that a plain espeak-ng install lacks.
    """
    names: set[str] = set()
    for line in listing.splitlines()[1:]:
        columns = line.split()
        if len(columns) < 5 or columns[4].startswith("mb/"):
            continue
        language, name, file = columns[1], columns[3], columns[4]
        names.update({language.lower(), name.lower(), file.lower(), file.split("/")[-1].lower()})
    return names


PIPER = "piper"
"""The name a session's voice has when the Piper voice speaks it."""

# Scripts the English Piper voice cannot read, and the espeak-ng voice that can.
_SCRIPTS = (
    (re.compile(r"[\u3040-\u30ff]"), "ja"),
    (re.compile(r"[\uac00-\ud7af\u1100-\u11ff]"), "ko"),
    (re.compile(r"[\u4e00-\u9fff\u3400-\u4dbf]"), "cmn"),
    (re.compile(r"[\u0400-\u04ff]"), "ru"),
    (re.compile(r"[\u0370-\u03ff]"), "el"),
    (re.compile(r"[\u0600-\u06ff]"), "ar"),
    (re.compile(r"[\u0900-\u097f]"), "hi"),
)


def foreign_voice(text: str) -> str | None:
    """The espeak-ng voice for ``text`` written in a script English is not
    written in (Chinese, Japanese, Korean, Cyrillic, ...), else None."""
    for script, voice in _SCRIPTS:
        if script.search(text):
            return voice
    return None


class Speech:
    """What the cascade speaks with: the Piper voice for English (when it has
    one), espeak-ng for every other language and for the voices a request
    names. The same API as :class:`EspeakTTS`; a session's voice is
    :data:`PIPER` or an espeak-ng voice name."""

    def __init__(self, espeak: EspeakTTS, piper: PiperVoice | None) -> None:
        self.espeak = espeak
        self.piper = piper

    def load(self) -> None:
        self.espeak.load()
        if self.piper is not None:
            self.piper.load()

    def close(self) -> None:
        if self.piper is not None:
            self.piper.close()

    @property
    def default_voice(self) -> str:
        return PIPER if self.piper is not None else self.espeak.default

    def knows(self, name: str) -> bool:
        return (name.lower() == PIPER and self.piper is not None) or self.espeak.knows(name)

    def synthesize(self, text: str, voice: str) -> np.ndarray:
        if voice != PIPER or self.piper is None:
            return self.espeak.synthesize(text, voice)
        other = foreign_voice(text)
        if other is not None:  # the answer's language, not the voice's
            return self.espeak.synthesize(text, other)
        text = speakable(text)
        return self.piper.synthesize(text) if text else np.zeros(0, dtype=np.float32)

    def timed(self, text: str, voice: str) -> tuple[np.ndarray, float]:
        started = time.perf_counter()
        audio = self.synthesize(text, voice)
        return audio, (time.perf_counter() - started) * 1000

    def resolve_voice(self, voice: Voice | None) -> SpokenVoice:
        """The Piper voice unless the request names an espeak-ng voice or a
        language other than English; what could not be honoured is warned of."""
        named = [w for w in ((voice.name, voice.language) if voice else ()) if w]
        english = all(w.lower() in (PIPER, "en", "en-us", "en_us") for w in named)
        if self.piper is None or not english:
            return self.espeak.resolve_voice(voice)
        warnings = self.espeak.resolve_voice(
            Voice(reference=voice.reference) if voice is not None else None
        ).warnings  # the reference-voice warning, if any
        return SpokenVoice(PIPER, warnings)

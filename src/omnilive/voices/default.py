"""The engine's default voice, as a sample a page can play and reuse.

The gateway has no engine loaded, so it derives the voice from the same
settings the workers use: MiniCPM-o's configured reference WAV, or the espeak-ng
voice the cascade speaks with. An engine without a reference of its own gets a
sample spoken by espeak-ng.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from omnilive.config import Settings
from omnilive.voices.decode import decode_file
from omnilive.voices.speech import SpeechCache

SAMPLE_TEXT = "Hello! This is my default voice. How can I help you today?"


@dataclass(frozen=True)
class DefaultVoice:
    name: str
    audio: np.ndarray  # 16 kHz float32


def default_voice(settings: Settings, engine: str, cache: SpeechCache) -> DefaultVoice:
    """The default voice of ``engine`` under ``settings``. Blocking."""
    voices = settings.voices
    reference = settings.minicpmo.default_voice
    if engine == "minicpmo" and reference is not None:
        path = Path(reference)
        audio = decode_file(path, voices.max_duration_s, voices.decode_timeout_s)
        return DefaultVoice(name=path.stem, audio=audio)
    espeak_voice = settings.cascade.voice if engine == "cascade" else voices.default_espeak_voice
    audio = cache.speech(SAMPLE_TEXT, espeak_voice)
    return DefaultVoice(name=f"espeak-ng {espeak_voice}", audio=audio)

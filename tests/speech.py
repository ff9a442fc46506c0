"""Spoken test inputs made on the spot with espeak-ng (no downloads)."""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from omnilive.audio import INPUT_RATE, read_wav, resample

if TYPE_CHECKING:
    from omnilive.engines.cascade.piper import VoiceConfig


@functools.lru_cache(maxsize=64)
def _spoken(text: str, voice: str) -> bytes:
    """espeak-ng's speech, 16 kHz float32 bytes. With ``OMNILIVE_SPEECH_CACHE``
    set, kept in (and read from) that folder: a GPU machine without
    espeak-ng plays what this machine spoke."""
    cache = os.environ.get("OMNILIVE_SPEECH_CACHE")
    name = hashlib.sha256(f"{voice}\n{text}".encode()).hexdigest()[:24] + ".f32"
    if cache and (Path(cache) / name).is_file():
        return (Path(cache) / name).read_bytes()
    wav = subprocess.run(
        ["espeak-ng", "-v", voice, "-s", "165", "--stdout", text],
        check=True,
        capture_output=True,
    ).stdout
    samples, rate = read_wav(wav)
    spoken = resample(samples, rate, INPUT_RATE).tobytes()
    if cache:
        Path(cache).mkdir(parents=True, exist_ok=True)
        (Path(cache) / name).write_bytes(spoken)
    return spoken


# A spoken question about the weather that Whisper hears whole on any CPU:
# its int8 decoding heard espeak-ng's "What is the weather in Paris?" as "the
# winner" at 2 of 12 paddings here (and other weather questions at up to 6),
# which made a turn that needs the weather judge neither delegated nor called.
# This one was heard right at 12 of 12.
WEATHER_QUESTION = "How is the weather in London today?"


def speak(text: str, voice: str = "en-us") -> np.ndarray:
    """``text`` spoken by espeak-ng, as 16 kHz float32 (trimmed of edge silence)."""
    samples = np.frombuffer(_spoken(text, voice), dtype=np.float32)
    voiced = np.flatnonzero(np.abs(samples) > 0.01)
    return samples[voiced[0] : voiced[-1] + 1].copy() if voiced.size else samples.copy()


def silence(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds * INPUT_RATE), np.float32)


def chunks_b64(audio: np.ndarray, seconds: float = 0.5) -> list[str]:
    """Split 16 kHz audio into base64 float32 chunks, as clients send them."""
    size = round(seconds * INPUT_RATE)
    return [
        base64.b64encode(audio[i : i + size].astype("<f4").tobytes()).decode()
        for i in range(0, audio.size, size)
    ]


def trimmed(samples: np.ndarray, level: float = 0.01) -> np.ndarray:
    voiced = np.flatnonzero(np.abs(samples) > level)
    return samples[voiced[0] : voiced[-1] + 1].copy() if voiced.size else samples.copy()


def steady(config: VoiceConfig) -> VoiceConfig:
    """A Piper voice's configuration that reads a text the same way every time:
    the voice draws its pitch and durations at random (``noise_scale``,
    ``noise_w``)."""
    return dataclasses.replace(config, noise_scale=0.0, noise_w=0.0)


@functools.lru_cache(maxsize=1)
def _piper():  # the cascade's Piper voice, loaded once per process, without its noise
    from omnilive.engines.cascade.piper import PiperVoice, packaged_voice

    voice = PiperVoice(packaged_voice(), threads=2)
    voice.load()
    # The voice draws its pitch and durations at random each time (noise_scale,
    # noise_w): the same question came out 1.9 s long in one run and 2.1 s in
    # the next. Test speech is the same every time.
    assert voice.config is not None
    voice.config = steady(voice.config)
    return voice


def speak_piper(text: str) -> np.ndarray:
    """``text`` spoken by the cascade's Piper voice, 16 kHz float32, trimmed;
    the same samples every time."""
    from omnilive.audio import OUTPUT_RATE

    return trimmed(resample(_piper().synthesize(text), OUTPUT_RATE, INPUT_RATE))


def longest_pause(speech: np.ndarray, frame: int = 320, level: float = 0.02) -> tuple[int, int]:
    """The first and last sample of the longest quiet stretch inside ``speech``
    (20 ms frames): where a speaker spoken "... for, four ..." stops."""
    loud = np.array([np.abs(speech[i : i + frame]).max() > level
                     for i in range(0, speech.size - frame, frame)])  # fmt: skip
    voiced = np.flatnonzero(loud)
    best, start = (0, 0), None
    for i in range(voiced[0], voiced[-1]):
        if loud[i]:
            start = None
            continue
        start = i if start is None else start
        if i - start + 1 > best[1]:
            best = (start, i - start + 1)
    return best[0] * frame, (best[0] + best[1]) * frame

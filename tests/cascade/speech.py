"""Spoken test inputs and transcript comparison."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable

import numpy as np

from omnilive.audio import INPUT_RATE, read_wav, resample

Say = Callable[[str], np.ndarray]


def words(text: str) -> set[str]:
    """Lower-case words without punctuation, for comparing transcripts."""
    return set(re.sub(r"[^a-z0-9' ]", " ", text.lower()).split())


def overlap(expected: str, heard: str) -> float:
    """Share of the expected words that were heard."""
    wanted = words(expected)
    return len(wanted & words(heard)) / len(wanted)


def espeak(text: str, rate: int = INPUT_RATE, voice: str = "en-us") -> np.ndarray:
    """``text`` spoken by espeak-ng, as float32 mono at ``rate``."""
    wav = subprocess.run(
        ["espeak-ng", "-v", voice, "--stdout", text], capture_output=True, check=True
    ).stdout
    samples, src_rate = read_wav(wav)
    return resample(samples, src_rate, rate)


def silence(seconds: float, rate: int = INPUT_RATE) -> np.ndarray:
    return np.zeros(round(seconds * rate), dtype=np.float32)

"""Speech the project makes itself with espeak-ng: preset prompts and the
default voice sample. Nothing is downloaded; results are cached as WAV files
keyed by what was said and by which voice, so each is synthesised once."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import numpy as np

from omnilive.audio import INPUT_RATE, AudioDecodeError, read_wav, resample, wav_bytes
from omnilive.recording.files import write_atomic

ESPEAK = "espeak-ng"
WORDS_PER_MINUTE = 160
SYNTH_TIMEOUT_S = 20.0


class SpeechError(RuntimeError):
    """espeak-ng is missing or could not say the text."""


def synthesize(text: str, voice: str) -> np.ndarray:
    """``text`` spoken by espeak-ng as 16 kHz float32. Blocking."""
    if shutil.which(ESPEAK) is None:
        raise SpeechError(f"{ESPEAK} is not installed (apt-get install {ESPEAK})")
    command = [ESPEAK, "-v", voice, "-s", str(WORDS_PER_MINUTE), "-b", "1", "--stdout"]
    try:
        done = subprocess.run(
            command,
            input=text.encode("utf-8"),
            capture_output=True,
            timeout=SYNTH_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise SpeechError(f"{ESPEAK} took longer than {SYNTH_TIMEOUT_S:.0f} s") from None
    if done.returncode != 0 or not done.stdout:
        detail = done.stderr.decode("utf-8", "replace").strip()
        raise SpeechError(f"{ESPEAK} -v {voice} failed: {detail or done.returncode}")
    try:
        samples, rate = read_wav(done.stdout)
    except AudioDecodeError as exc:
        raise SpeechError(f"{ESPEAK} produced no audio: {exc}") from None
    return resample(samples, rate, INPUT_RATE)


class SpeechCache:
    """:func:`synthesize` behind a folder of 16 kHz PCM16 WAV files."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    def path_for(self, text: str, voice: str) -> Path:
        key = f"{ESPEAK}\n{WORDS_PER_MINUTE}\n{voice}\n{text}".encode()
        return self.folder / f"{hashlib.sha256(key).hexdigest()[:32]}.wav"

    def speech(self, text: str, voice: str) -> np.ndarray:
        """Cached speech; made and stored on the first call. Blocking."""
        path = self.path_for(text, voice)
        try:
            samples, rate = read_wav(path.read_bytes())
            return resample(samples, rate, INPUT_RATE)
        except (OSError, AudioDecodeError):
            pass  # not cached yet (or a broken file): make it again
        samples = synthesize(text, voice)
        self.folder.mkdir(parents=True, exist_ok=True)
        write_atomic(path, wav_bytes(samples, INPUT_RATE))
        return samples

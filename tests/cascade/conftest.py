"""One loaded cascade engine for the whole test session, and spoken test inputs.

Loading (and, the first time, joining the Whisper model) is the slow part, so
every test shares the engine; each test opens its own sessions.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from omnilive.engine_settings import CascadeSettings
from omnilive.engines.cascade import CascadeEngine
from tests.cascade.speech import Say, espeak


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cascade-data")


@pytest.fixture(scope="session")
def engine(data_dir: Path) -> Iterator[CascadeEngine]:
    engine = CascadeEngine(CascadeSettings(), data_dir)
    stages: list[tuple[str, float]] = []
    engine.load(lambda stage, fraction: stages.append((stage, fraction)))
    assert stages[-1] == ("ready", 1.0)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def say() -> Say:
    """espeak-ng speech at 16 kHz, made once per sentence."""
    cache: dict[str, np.ndarray] = {}

    def speak(text: str) -> np.ndarray:
        if text not in cache:
            cache[text] = espeak(text)
        return cache[text]

    return speak

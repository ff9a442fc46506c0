"""A fake model behind the real engine: every view exercised on the CPU, no torch.

``engine`` loads :class:`MiniCPMoEngine` from a checkpoint directory that passes
the file checks, through a backend that hands out a fake model object instead
of calling transformers.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from omnilive.audio import wav_bytes
from omnilive.engine_settings import MiniCPMoSettings
from omnilive.engines.minicpmo import MiniCPMoEngine
from omnilive.engines.minicpmo.backend import DeviceInfo
from omnilive.engines.minicpmo.checkpoint import CheckpointInfo
from tests.minicpmo.fake_model import FakeMiniCPMO

GIB = 2**30


class RecordingGraphs:
    """Stands in for the CUDA step graphs: records when they are switched on and off."""

    def __init__(self) -> None:
        self.attached: Any = None
        self.active = False
        self.releases = 0

    def attach(self, duplex: Any = None) -> None:
        self.attached = duplex
        self.active = True

    def release(self) -> None:
        self.active = False
        self.releases += 1

    def stats(self) -> dict[str, dict[str, float]]:
        return {"llm": {"replays": 0}}


class FakeBackend:
    """Hands out a fake model; counts memory the way a GPU would hold it."""

    def __init__(
        self, factory: Callable[[], FakeMiniCPMO] = FakeMiniCPMO, free_gib: float = 70.0
    ) -> None:
        self.factory = factory
        self.free_gib = free_gib
        self.model: FakeMiniCPMO | None = None
        self.releases = 0
        self.graphs: RecordingGraphs | None = None
        self.configured = 0  # configure_process() calls

    def configure_process(self) -> None:
        self.configured += 1

    def check_device(self, device: str) -> DeviceInfo:
        return DeviceInfo("Fake GPU", int(self.free_gib * GIB), 80 * GIB)

    def load_model(
        self, checkpoint: CheckpointInfo, settings: MiniCPMoSettings, progress: Any
    ) -> FakeMiniCPMO:
        progress("loading weights", 0.1)
        self.model = self.factory()
        return self.model

    def step_graphs(self, model: Any, settings: MiniCPMoSettings) -> RecordingGraphs | None:
        self.graphs = RecordingGraphs() if settings.cuda_graphs else None
        return self.graphs

    def release_memory(self) -> None:
        self.releases += 1

    def memory_stats(self) -> dict[str, float]:
        return {"allocated_mib": float(self.model.live if self.model else 0)}


@pytest.fixture(autouse=True)
def reproducible_sampling(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each session a test opens samples from a seed made of the test's name
    and the session's number, not a fresh random one: an answer of a random
    tiny model ends at a sampled end token, and one in forty ended within its
    first second (CI saw a spoken answer of one piece), so a test that needs
    a long answer failed now and then, and never again when run alone."""
    from omnilive.engines.minicpmo.sessions.duplex import session as duplex
    from omnilive.engines.minicpmo.sessions.simplex import session as simplex

    seeds = itertools.count(zlib.crc32(request.node.nodeid.encode()))
    fixed = SimpleNamespace(randbits=lambda bits: next(seeds) % (1 << bits))
    for module in (simplex, duplex):
        monkeypatch.setattr(module, "secrets", fixed)


def write_checkpoint(path: Path, shards: int = 2) -> Path:
    """The files a MiniCPM-o checkpoint has, with tiny contents."""
    path.mkdir(parents=True, exist_ok=True)
    config = {
        "model_type": "minicpmo",
        "auto_map": {
            "AutoConfig": "configuration_minicpmo.MiniCPMOConfig",
            "AutoModel": "modeling_minicpmo.MiniCPMO",
        },
    }
    (path / "config.json").write_text(json.dumps(config))
    for name in ("configuration_minicpmo.py", "modeling_minicpmo.py"):
        (path / name).write_text("# model code\n")
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json", "preprocessor_config.json"):
        (path / name).write_text("{}")
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    weight_map = {f"layer.{i}.weight": name for i, name in enumerate(names)}
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    for name in names:
        (path / name).write_bytes(b"\0" * 1024)
    return path


def voice(seconds: float = 1.5, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (0.1 * rng.standard_normal(round(seconds * 16000))).astype(np.float32)


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    return write_checkpoint(tmp_path / "ckpt")


@pytest.fixture
def voice_file(tmp_path: Path) -> Path:
    path = tmp_path / "voice.wav"
    path.write_bytes(wav_bytes(voice(2.0, seed=7), 16000))
    return path


EngineFactory = Callable[..., tuple[MiniCPMoEngine, FakeBackend]]


@pytest.fixture
def make_engine(checkpoint: Path, voice_file: Path) -> Iterator[EngineFactory]:
    """``make_engine(factory=..., **settings)`` → a loaded oracle engine (the
    model's own code path) over a fake model, and its backend."""
    engines: list[MiniCPMoEngine] = []

    def make(factory: Callable[[], FakeMiniCPMO] = FakeMiniCPMO, **overrides: Any):
        # The fake model stands in for the model code: the oracle's path, its views over that code.
        fields = {"model_path": checkpoint, "default_voice": voice_file, "warmup": False}
        backend = FakeBackend(factory)
        settings = MiniCPMoSettings(**{**fields, **overrides})
        engine = MiniCPMoEngine(settings, backend=backend, oracle=True)
        engine.load(lambda stage, fraction: None)
        engines.append(engine)
        return engine, backend

    yield make
    for engine in engines:
        engine.close()


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random checkpoint of the published architecture with the model's
    own code, for the tests that need that code (see ``model_code.py``)."""
    from tests.minicpmo.model_code import tiny_checkpoint as build_tiny

    return build_tiny(tmp_path_factory)


@pytest.fixture(scope="module")
def tiny_shared(tiny_checkpoint: Path) -> Any:
    """The shared parts (:class:`SharedModel`) of the tiny checkpoint loaded
    through the unified model code, on the CPU in float32."""
    from benchmarks.duplex_equality import load_reference

    from omnilive.engines.minicpmo.sessions.duplex.unit_rules import UnitRules
    from omnilive.engines.minicpmo.sessions.shared import SharedModel

    owner = load_reference(tiny_checkpoint, "unified", "cpu", "float32", budget=8, forced=0)
    return SharedModel.of_duplex(owner, UnitRules())


@pytest.fixture
async def make() -> AsyncIterator[Callable[..., Any]]:
    """Batch loops over a model's slots, closed after the test (their threads
    end); torch is imported only by the tests that ask for one."""
    from omnilive.engines.minicpmo.runtime.loop import BatchLoop
    from tests.minicpmo.test_batch import batched

    made: list[BatchLoop] = []

    def make(llm: Any, slots: int, capacity: int, **options: Any) -> BatchLoop:
        made.append(BatchLoop(batched(llm, slots, capacity), **options))
        return made[-1]

    yield make
    for loop in made:
        loop.close()
        await asyncio.to_thread(loop.thread.join, 5)
        assert not loop.thread.is_alive()

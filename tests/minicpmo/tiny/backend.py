"""The engine's backend seam for the tiny model: it hands out
:func:`~tests.minicpmo.tiny.model.build`'s model on the CPU, with as much
"GPU memory" as the test says is free."""

from __future__ import annotations

import gc
from typing import Any

from omnilive.engine_settings import MiniCPMoSettings
from omnilive.engines.minicpmo.backend import DeviceInfo
from tests.minicpmo.tiny.model import TinyMiniCPMO, build

GIB = 2**30


class TinyBackend:
    def __init__(self, free_gib: float = 64.0, seed: int = 0) -> None:
        self.free_gib = free_gib
        self.seed = seed

    def configure_process(self) -> None:
        pass  # nothing process-wide to set on the CPU

    def check_device(self, device: str) -> DeviceInfo:
        return DeviceInfo("CPU", int(self.free_gib * GIB), int(self.free_gib * GIB))

    def load_model(
        self, checkpoint: Any, settings: MiniCPMoSettings, progress: Any
    ) -> TinyMiniCPMO:
        return build(self.seed)

    def step_graphs(self, model: Any, settings: MiniCPMoSettings) -> None:
        return None

    def release_memory(self) -> None:
        gc.collect()

    def memory_stats(self) -> dict[str, float]:
        return {}

"""Where the model's own code is at hand (it is published with the checkpoint
and never committed here): ``OMNILIVE_MODEL_CODE``, or the ignored
``.ext/MiniCPMO45`` folder. Tests that need it are skipped elsewhere, CI
included; they build a tiny random checkpoint of the same architecture."""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from omnilive.engine_settings import MiniCPMoSettings
from omnilive.engines.minicpmo.backend import DeviceInfo

CODE = Path(os.environ.get("OMNILIVE_MODEL_CODE", Path(__file__).parents[2] / ".ext/MiniCPMO45"))

needs_model_code = [
    pytest.mark.skipif(
        not (CODE / "modeling_minicpmo.py").is_file(), reason=f"no model code in {CODE}"
    ),
    # The model code and the transformers it was written for warn freely.
    pytest.mark.filterwarnings("ignore"),
]


def tiny_checkpoint(factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("soundfile")  # the model code's own imports
    pytest.importorskip("accelerate")
    from benchmarks.gpu_checkpoint import build_checkpoint

    out = factory.mktemp("tiny_minicpmo")
    build_checkpoint(CODE, out, tiny=True, device="cpu")
    return out


GIB = 2**30


class CpuBackend:
    """The model's own code on the CPU in float32, with as much "GPU memory"
    as the test says is free."""

    def __init__(self, ckpt: Path, free_gib: float = 64.0) -> None:
        self.ckpt = ckpt
        self.free_gib = free_gib

    def configure_process(self) -> None:
        pass  # nothing process-wide to set on the CPU

    def check_device(self, device: str) -> DeviceInfo:
        return DeviceInfo("CPU", int(self.free_gib * GIB), int(self.free_gib * GIB))

    def load_model(self, checkpoint: Any, settings: MiniCPMoSettings, progress: Any) -> Any:
        import torch
        import transformers

        if str(self.ckpt / "standin") not in sys.path:
            sys.path.insert(0, str(self.ckpt / "standin"))  # the vocoder's stand-in
        model = transformers.AutoModel.from_pretrained(
            str(self.ckpt), trust_remote_code=True, torch_dtype=torch.float32
        )
        return model.eval()

    def step_graphs(self, model: Any, settings: MiniCPMoSettings) -> None:
        return None

    def release_memory(self) -> None:
        gc.collect()

    def memory_stats(self) -> dict[str, float]:
        return {}

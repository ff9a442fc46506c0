"""Everything that touches torch, CUDA and transformers, imported lazily.

The engine talks to a :class:`Backend`; :class:`TorchBackend` is the real one.
Keeping the heavy imports here means ``omnilive`` imports, and the CPU engines
run, on machines that have neither torch nor a GPU, and lets the contract
tests swap in a fake model without touching the engine's logic.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from typing import Any, Protocol

from omnilive.engine_settings import MiniCPMoSettings
from omnilive.engines.base import EngineError, EngineUnavailable, ProgressCallback
from omnilive.engines.minicpmo.checkpoint import CheckpointInfo
from omnilive.engines.minicpmo.remote_code import optional_imports_stood_in

log = logging.getLogger(__name__)
GIB = 2**30


class GpuError(EngineUnavailable):
    """No usable GPU, or not enough of its memory."""


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    free_bytes: int
    total_bytes: int


class StepGraphSet(Protocol):
    """Faster model steps (``graphs.ModelGraphs``), active while a session runs."""

    def attach(self, duplex: Any = None) -> None: ...

    def release(self) -> None: ...

    def stats(self) -> dict[str, dict[str, float]]: ...


class Backend(Protocol):
    """Loads the model and manages device memory."""

    def configure_process(self) -> None:
        """Make the process-wide settings the backend's library needs; called
        once, first when the engine loads, before any model code runs."""
        ...

    def check_device(self, device: str) -> DeviceInfo:
        """Raise :class:`GpuError` if the device cannot be used."""
        ...

    def load_model(
        self, checkpoint: CheckpointInfo, settings: MiniCPMoSettings, progress: ProgressCallback
    ) -> Any:
        """Return the loaded model object, on the device, in eval mode."""
        ...

    def step_graphs(self, model: Any, settings: MiniCPMoSettings) -> StepGraphSet | None:
        """CUDA graphs for the model's short steps, or None to run them eagerly."""
        ...

    def release_memory(self) -> None:
        """Give cached device memory back after a session."""
        ...

    def memory_stats(self) -> dict[str, float]:
        """Allocated / reserved / peak device memory in MiB (empty if unknown)."""
        ...


def _import_torch() -> Any:
    try:
        return importlib.import_module("torch")
    except ImportError:
        raise GpuError(
            "the minicpmo engine needs the GPU dependencies: pip install 'omnilive[cuda]' "
            "(torch is not installed)"
        ) from None


class TorchBackend:
    """The real backend: ``AutoModel.from_pretrained(..., trust_remote_code=True)`` in bf16."""

    def configure_process(self) -> None:
        torch = _import_torch()
        # No cuDNN attention in this process: it builds an execution plan for
        # every new shape (on an H200 up to ~0.8 s the first time), and the
        # encoders' shapes keep changing (a session's Whisper cache grows by
        # a chunk every second; each reference voice has its own length). The
        # switch is process-wide (torch's sdpa_kernel() is not per thread), so
        # it is made once, before any step graph is captured.
        torch.backends.cuda.enable_cudnn_sdp(False)

    def check_device(self, device: str) -> DeviceInfo:
        torch = _import_torch()
        if not device.startswith("cuda"):
            raise GpuError(f"the minicpmo engine runs on an NVIDIA GPU, not on {device!r}")
        if not torch.cuda.is_available():
            raise GpuError(
                "the minicpmo engine needs an NVIDIA GPU, but CUDA is not available "
                f"(torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}); "
                "use --engine cascade on machines without one"
            )
        index = torch.device(device).index or 0
        if index >= torch.cuda.device_count():
            raise GpuError(f"{device} does not exist: {torch.cuda.device_count()} GPU(s) visible")
        free, total = torch.cuda.mem_get_info(index)
        return DeviceInfo(torch.cuda.get_device_name(index), int(free), int(total))

    def load_model(
        self, checkpoint: CheckpointInfo, settings: MiniCPMoSettings, progress: ProgressCallback
    ) -> Any:
        torch = _import_torch()
        try:
            transformers = importlib.import_module("transformers")
        except ImportError:
            raise GpuError(
                "the minicpmo engine needs transformers: pip install 'omnilive[cuda]'"
            ) from None
        progress("loading weights", 0.1)
        try:
            with optional_imports_stood_in():
                model = transformers.AutoModel.from_pretrained(
                    str(checkpoint.path),
                    trust_remote_code=True,
                    torch_dtype=torch.bfloat16,
                    attn_implementation=settings.attn_implementation,
                )
            progress("moving to the GPU", 0.5)
            model = model.eval().to(settings.device)
            if settings.vocoder_tf32:
                # Every other module computes in bfloat16: of the model's
                # float32 work only the vocoder's matrix products change.
                torch.set_float32_matmul_precision("high")
                log.info("float32 matrix products (the vocoder's) run in TF32")
        except torch.cuda.OutOfMemoryError as exc:
            # Another process may hold the memory for now: worth a retry.
            raise EngineError(f"out of GPU memory while loading the weights: {exc}") from None
        except ImportError as exc:
            # The checkpoint's code imports its own dependencies (minicpmo-utils,
            # soundfile, ...): name the missing one instead of a bare traceback.
            raise EngineUnavailable(
                f"the checkpoint's model code needs a missing package: {exc}; "
                "pip install 'omnilive[cuda]' and pip install --no-deps minicpmo-utils==1.0.6"
            ) from None
        return model

    def step_graphs(self, model: Any, settings: MiniCPMoSettings) -> StepGraphSet | None:
        if not settings.cuda_graphs or settings.torch_compile:
            return None
        from omnilive.engines.minicpmo.reference.graphs import ModelGraphs
        from omnilive.engines.minicpmo.sessions.voice.flow import graph_model_code_flow

        tokenizer = getattr(getattr(model, "tts", None), "audio_tokenizer", None)
        if tokenizer is not None and graph_model_code_flow(tokenizer):
            # The vocoder's flow blocks in the model code's own answers: one
            # second's chunk ~190 -> ~85 ms (benchmarks/gpu_vocoder.py).
            log.info("the model code's vocoder flow runs its blocks as CUDA graphs")
        try:
            return ModelGraphs(model)
        except (AttributeError, ImportError) as exc:
            # Model code of another shape: it still runs, only eagerly.
            log.warning("no CUDA graphs for this model's steps: %s", exc)
            return None

    def release_memory(self) -> None:
        # torch's cached blocks only. No gc.collect(): in the worker a full
        # collection took ~350 ms a session on an H200 host (py-spy: a third of
        # the simplex seat's time in a run of chats), holding the interpreter
        # lock, so every duplex session's batch loop stalled with it, and the
        # next chat waited for it. The session's tensors go with the model's
        # reset state; cycles among them go at the interpreter's own collections.
        torch = importlib.import_module("torch")
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def memory_stats(self) -> dict[str, float]:
        torch = importlib.import_module("torch")
        if not torch.cuda.is_available():
            return {}
        mib = 2**20
        return {
            "allocated_mib": torch.cuda.memory_allocated() / mib,
            "reserved_mib": torch.cuda.memory_reserved() / mib,
            "peak_mib": torch.cuda.max_memory_allocated() / mib,
        }


def check_memory(info: DeviceInfo, checkpoint: CheckpointInfo, headroom_gb: float) -> None:
    """Refuse to start a load that cannot fit, before it spends minutes failing."""
    needed = checkpoint.weight_bytes + headroom_gb * GIB
    if info.free_bytes < needed:
        raise GpuError(
            f"not enough GPU memory on {info.name}: {info.free_bytes / GIB:.1f} GiB free of "
            f"{info.total_bytes / GIB:.1f} GiB, the checkpoint needs about {needed / GIB:.1f} GiB "
            f"({checkpoint.weight_gib:.1f} GiB of weights + {headroom_gb:.1f} GiB headroom)"
        )

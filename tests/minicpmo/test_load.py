"""Loading: progress, warm-up, and a clear error for each way it cannot work."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest

from omnilive.engine_settings import MiniCPMoSettings
from omnilive.engines.base import EngineError
from omnilive.engines.minicpmo import MiniCPMoEngine
from omnilive.engines.minicpmo.backend import GpuError, TorchBackend
from omnilive.engines.minicpmo.checkpoint import CheckpointError
from omnilive.engines.minicpmo.engine import GIL_SWITCH_S, physical_gpu
from tests.minicpmo.conftest import EngineFactory, FakeBackend
from tests.minicpmo.fake_model import FakeUnifiedMiniCPMO


def load(settings: MiniCPMoSettings, backend) -> list[tuple[str, float]]:
    stages: list[tuple[str, float]] = []
    MiniCPMoEngine(settings, backend=backend, oracle=True).load(lambda s, f: stages.append((s, f)))
    return stages


def test_load_reports_progress_and_warms_every_view_up(checkpoint: Path, voice_file: Path):
    backend = FakeBackend()
    settings = MiniCPMoSettings(model_path=checkpoint, default_voice=voice_file)
    stages = load(settings, backend)
    fractions = [f for _, f in stages]
    assert fractions == sorted(fractions) and stages[-1] == ("ready", 1.0)
    assert {"checking the checkpoint", "loading weights", "warming up"} <= {s for s, _ in stages}
    model = backend.model
    assert model is not None and model.tts_ready
    assert model.generations and model.generations[0]["generate_audio"]  # chat, with speech
    duplex = model.duplex_object
    assert duplex is not None and [c for c, _ in duplex.calls][:4] == [
        "prepare", "prefill", "generate", "finalize"
    ]  # fmt: skip
    assert duplex.calls[2][1]["force_listen"] is False  # the warm-up unit may speak
    assert model.live == 0  # the warm-up sessions left nothing behind


def test_the_unified_model_code_is_set_up_with_init_unified(checkpoint: Path):
    backend = FakeBackend(FakeUnifiedMiniCPMO)
    load(MiniCPMoSettings(model_path=checkpoint, warmup=False), backend)
    model = backend.model
    assert isinstance(model, FakeUnifiedMiniCPMO) and model.duplex is not None


def test_a_bad_checkpoint_fails_before_the_gpu_is_touched(tmp_path: Path):
    backend = FakeBackend()
    with pytest.raises(CheckpointError, match="does not exist"):
        load(MiniCPMoSettings(model_path=tmp_path / "missing"), backend)
    assert backend.model is None


def test_too_little_gpu_memory_is_refused_with_the_numbers(checkpoint: Path):
    backend = FakeBackend(free_gib=3.0)
    with pytest.raises(GpuError, match=r"not enough GPU memory on Fake GPU: 3\.0 GiB free"):
        load(MiniCPMoSettings(model_path=checkpoint, memory_headroom_gb=4.0), backend)
    assert backend.model is None


def test_model_code_that_is_not_minicpmo_is_named(checkpoint: Path):
    backend = FakeBackend(lambda: types.SimpleNamespace(reset_session=lambda **_: None))  # type: ignore[arg-type, return-value]
    with pytest.raises(EngineError, match="neither as_duplex"):
        load(MiniCPMoSettings(model_path=checkpoint, warmup=False), backend)


def test_an_unreadable_default_voice_is_named(checkpoint: Path, tmp_path: Path):
    (tmp_path / "bad.wav").write_bytes(b"RIFF....")
    settings = MiniCPMoSettings(model_path=checkpoint, default_voice=tmp_path / "bad.wav")
    with pytest.raises(EngineError, match=r"default voice .*bad\.wav"):
        load(settings, FakeBackend())


def test_no_torch_names_the_cuda_extra(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch → ImportError
    with pytest.raises(GpuError, match=r"pip install 'omnilive\[cuda\]'"):
        TorchBackend().check_device("cuda")


def test_no_cuda_device_is_a_clear_error(monkeypatch: pytest.MonkeyPatch):
    fake_torch = types.SimpleNamespace(
        __version__="2.13.0+cpu",
        version=types.SimpleNamespace(cuda=None),
        cuda=types.SimpleNamespace(is_available=lambda: False),
    )
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    with pytest.raises(GpuError, match="needs an NVIDIA GPU, but CUDA is not available"):
        TorchBackend().check_device("cuda")
    with pytest.raises(GpuError, match="not on 'cpu'"):
        TorchBackend().check_device("cpu")


def test_views_before_load_are_refused(checkpoint: Path):
    engine = MiniCPMoEngine(
        MiniCPMoSettings(model_path=checkpoint), backend=FakeBackend(), oracle=True
    )
    with pytest.raises(EngineError, match="not loaded"):
        engine.open_chat()


def test_importing_and_building_the_engine_imports_no_gpu_package():
    code = (
        "import sys; from omnilive.engine_settings import MiniCPMoSettings; "
        "from omnilive.engines.minicpmo import MiniCPMoEngine; MiniCPMoEngine(MiniCPMoSettings()); "
        "print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("device", "visible", "expected"),
    [
        ("cuda", None, 0),
        ("cuda:1", None, 1),
        ("cuda", "3", 3),
        ("cuda:1", "2,5", 5),
        ("cuda:2", "2,5", None),  # not visible
        ("cuda", "GPU-8f1c", None),  # a UUID: no index to report
        ("cpu", None, None),
    ],
)
def test_the_gpu_id_health_reports(device, visible, expected):
    assert physical_gpu(device, visible) == expected


def test_a_loaded_engine_names_its_gpu(make_engine: EngineFactory, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6")
    engine, _ = make_engine()
    assert engine.gpu_id() == 6


def test_load_sets_the_process_knobs_first(tmp_path: Path):
    """The GIL switch interval and the backend's own switches (cuDNN attention
    off) are made when the engine loads, before anything else: even a load
    that fails at the checkpoint has made them."""
    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)
        backend = FakeBackend()
        with pytest.raises(CheckpointError):
            load(MiniCPMoSettings(model_path=tmp_path / "missing"), backend)
        assert backend.configured == 1
        assert sys.getswitchinterval() == pytest.approx(GIL_SWITCH_S)
    finally:
        sys.setswitchinterval(before)


def test_building_the_engine_sets_no_process_knob(checkpoint: Path):
    before = sys.getswitchinterval()
    backend = FakeBackend()
    MiniCPMoEngine(MiniCPMoSettings(model_path=checkpoint), backend=backend, oracle=True)
    assert backend.configured == 0 and sys.getswitchinterval() == before


def test_the_torch_backend_turns_cudnn_attention_off(monkeypatch: pytest.MonkeyPatch):
    switched: list[bool] = []
    fake_torch = types.SimpleNamespace(
        backends=types.SimpleNamespace(cuda=types.SimpleNamespace(enable_cudnn_sdp=switched.append))
    )
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    TorchBackend().configure_process()
    assert switched == [False]

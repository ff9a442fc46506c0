"""A checkpoint whose model code imports a package only under a switch loads
where that package is absent (MiniCPM-o 4.5's ``flag_gems``, imported with
``USE_FLAGOS=1``), through transformers' own ``trust_remote_code`` path."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from omnilive.engines.minicpmo.remote_code import optional_imports_stood_in

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")

CONFIGURATION = """
from transformers import PretrainedConfig


class SwitchedConfig(PretrainedConfig):
    model_type = "switched"
"""
MODELING = """
import os

import torch
from transformers import PreTrainedModel

from .configuration_switched import SwitchedConfig

if os.getenv("USE_FLAGOS") == "1":
    import flag_gems  # noqa: F401


class SwitchedModel(PreTrainedModel):
    config_class = SwitchedConfig

    def __init__(self, config):
        super().__init__(config)
        self.weight = torch.nn.Parameter(torch.zeros(2))
"""


def checkpoint(folder: Path) -> Path:
    folder.mkdir()
    (folder / "configuration_switched.py").write_text(CONFIGURATION)
    (folder / "modeling_switched.py").write_text(MODELING)
    auto_map = {
        "AutoConfig": "configuration_switched.SwitchedConfig",
        "AutoModel": "modeling_switched.SwitchedModel",
    }
    config = {"model_type": "switched", "architectures": ["SwitchedModel"], "auto_map": auto_map}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def load(folder: Path) -> object:
    """The model class through transformers' remote-code path (the import
    check included), built from the config: no weights needed (loading them
    on the CPU would need accelerate, which the test tier has not)."""
    config = transformers.AutoConfig.from_pretrained(str(folder), trust_remote_code=True)
    return transformers.AutoModel.from_config(config, trust_remote_code=True)


@pytest.fixture(autouse=True)
def no_flag_gems(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine without flag_gems, whatever ran before in this process: the
    tiny checkpoints of other tests put their stand-ins' folder (a flag_gems
    stub among them) on ``sys.path``."""
    path = [entry for entry in sys.path if not (Path(entry) / "flag_gems").exists()]
    monkeypatch.setattr(sys, "path", path)
    monkeypatch.delitem(sys.modules, "flag_gems", raising=False)


def test_the_switched_off_import_stands_in_while_the_code_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("USE_FLAGOS", raising=False)
    folder = checkpoint(tmp_path / f"switched_{tmp_path.name}")
    with pytest.raises(ImportError, match="flag_gems"):
        load(folder)  # transformers' check, as a user without flag_gems meets it
    with optional_imports_stood_in() as stood_in:
        model = load(folder)
    assert stood_in == ["flag_gems"]
    assert type(model).__name__ == "SwitchedModel"
    assert "flag_gems" not in sys.modules  # taken away again


def test_with_the_switch_on_the_package_is_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("USE_FLAGOS", "1")
    folder = checkpoint(tmp_path / f"switched_{tmp_path.name}")
    with optional_imports_stood_in() as stood_in, pytest.raises(ImportError, match="flag_gems"):
        load(folder)
    assert stood_in == []

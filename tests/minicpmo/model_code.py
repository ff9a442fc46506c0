"""Where the model's own code is at hand (it is published with the checkpoint
and never committed here): ``OMNILIVE_MODEL_CODE``, or the ignored
``.ext/MiniCPMO45`` folder. Tests that need it are skipped elsewhere, CI
included; they build a tiny random checkpoint of the same architecture."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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

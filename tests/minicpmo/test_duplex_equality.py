"""The batched duplex engine against the model's own code, on the CPU with a
tiny random checkpoint of the same architecture (benchmarks/duplex_equality.py).

The model's code is published with the checkpoint and never committed here:
these tests run where it is found (``OMNILIVE_MODEL_CODE``, or the ignored
``.ext/MiniCPMO45`` folder) and are skipped elsewhere, CI included; the GPU
run of the same harness is in benchmarks/results/duplex_equality_*.json."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CODE = Path(os.environ.get("OMNILIVE_MODEL_CODE", Path(__file__).parents[2] / ".ext/MiniCPMO45"))

pytestmark = [
    pytest.mark.skipif(
        not (CODE / "modeling_minicpmo.py").is_file(), reason=f"no model code in {CODE}"
    ),
    # The model code and the transformers it was written for warn freely.
    pytest.mark.filterwarnings("ignore"),
]


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("soundfile")  # the model code's own imports
    pytest.importorskip("accelerate")
    from benchmarks.gpu_checkpoint import build_checkpoint

    out = tmp_path_factory.mktemp("tiny_minicpmo")
    build_checkpoint(CODE, out, tiny=True, device="cpu")
    return out


@pytest.mark.parametrize("flavour", ["standalone", "unified"])
def test_batched_sessions_decide_as_the_model_code_alone(
    tiny_checkpoint: Path, flavour: str
) -> None:
    from benchmarks.duplex_equality import check

    report = check(tiny_checkpoint, flavour, sessions=4, units=10)
    assert report["mismatches"] == []
    assert report["units_compared"] == 40
    assert report["speak_units"] > 0  # the speech LM was held to it too
    assert report["max_logit_difference"] < 1e-3
    assert max(report["batch_sizes"]) > 1  # the sessions did share forwards

"""The batched duplex engine against the model's own code, on the CPU with a
tiny random checkpoint of the same architecture (benchmarks/duplex_equality.py).

The model's code is published with the checkpoint and never committed here:
these tests run where it is found (``OMNILIVE_MODEL_CODE``, or the ignored
``.ext/MiniCPMO45`` folder) and are skipped elsewhere, CI included; the GPU
run of the same harness is in benchmarks/results/duplex_equality_*.json."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.minicpmo.model_code import needs_model_code

pytestmark = needs_model_code


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
    assert max(report["speech_batch_sizes"]) > 1  # and speech LM steps
